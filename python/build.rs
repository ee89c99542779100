//! Compiles the C ABI's C++ shim of PyTorch's graph pool hooks (../capi/src/torch_hooks.cpp)
//! into the extension, as capi/build.rs does for libadaptalloc.so.
fn main() {
    println!("cargo:rerun-if-changed=../capi/src/torch_hooks.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .warnings(true)
        .file("../capi/src/torch_hooks.cpp")
        .compile("adaptalloc_torch_hooks");
}
