//! Compiles the C++ shim of PyTorch's graph pool hooks (src/torch_hooks.cpp) into the library.
fn main() {
    println!("cargo:rerun-if-changed=src/torch_hooks.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .warnings(true)
        .file("src/torch_hooks.cpp")
        .compile("adaptalloc_torch_hooks");
}
