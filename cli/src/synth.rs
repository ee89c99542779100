//! Deterministic synthetic workloads, described by TOML files in `tuning/workloads/`.
//!
//! A workload is a list of phases run one after another; each phase is a generator:
//! `training` (weights, optimizer state, per-layer activations and gradients), `serving` (LLM
//! decoding with varying sequence lengths and a KV cache that grows by reallocation), and
//! `churn` (many small, short-lived allocations). The same spec and seed always give the same
//! trace.

use serde::Deserialize;

use crate::trace::{Event, Op, Trace};
use adaptalloc::error::ConfigError;
use adaptalloc::rng::SplitMix64;
use adaptalloc::size::ByteSize;

/// A workload file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Short name, used in reports.
    pub name: String,
    /// What the workload models.
    #[serde(default)]
    pub description: String,
    /// Seed of every random choice (overridden by `synth --seed`).
    #[serde(default)]
    pub seed: u64,
    /// The phases, in order.
    #[serde(rename = "phase")]
    pub phases: Vec<Phase>,
}

/// The most events a workload may generate: its trace is held in memory (40 bytes an event).
pub const MAX_EVENTS: u64 = 20_000_000;

impl Phase {
    /// An upper bound on the events the phase generates (wide, so no spec overflows it).
    fn most_events(&self) -> u128 {
        let n = u128::from;
        match self {
            // Weights, then per step and layer an activation, a workspace, an incoming gradient
            // and a weight gradient (an alloc and a free each), then optimizer state.
            Phase::Training(t) => {
                2 * n(t.layers) + 8 * n(t.steps) * n(t.layers) + 2 * n(t.layers) * n(t.optimizer_states)
            }
            // Per request a prefill and a first cache; per token at most a step temporary and a
            // cache reallocation (two events each).
            Phase::Serving(s) => 2 + n(s.requests) * (4 + 4 * n(s.max_tokens)),
            Phase::Churn(c) => 2 * n(c.operations) + 2 * n(c.max_live),
        }
    }
}

/// One phase of a workload.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Phase {
    Training(TrainingPhase),
    Serving(ServingPhase),
    Churn(ChurnPhase),
}

/// A training loop: weights and optimizer state live for the phase; each step allocates an
/// activation per layer (kept until backward), a workspace per layer (freed at once), a gradient
/// per layer in backward (freed after the optimizer step).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrainingPhase {
    pub steps: u32,
    pub layers: u32,
    /// Weights of one layer.
    pub weight_bytes: ByteSize,
    /// Activation kept per layer per step.
    pub activation_bytes: ByteSize,
    /// Short-lived workspace per layer.
    pub workspace_bytes: ByteSize,
    /// Activations vary by up to this fraction from step to step (dynamic shapes); 0 = fixed.
    #[serde(default)]
    pub jitter: f64,
    /// Optimizer state per weight byte (2 for Adam).
    #[serde(default = "two")]
    pub optimizer_states: u32,
}

fn two() -> u32 {
    2
}

/// LLM serving: up to `concurrency` requests decode at once; each has a length drawn
/// log-uniformly in min..max tokens, a KV cache reallocated larger every `kv_block_tokens`
/// tokens, and a per-step temporary that grows with its length.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServingPhase {
    pub requests: u32,
    pub concurrency: u32,
    pub min_tokens: u32,
    pub max_tokens: u32,
    pub kv_bytes_per_token: ByteSize,
    pub kv_block_tokens: u32,
    /// Per-step temporary bytes per token of the request.
    pub temp_bytes_per_token: ByteSize,
    /// Model weights, allocated at the start of the phase.
    #[serde(default)]
    pub weight_bytes: ByteSize,
}

/// Many small, short-lived allocations: sizes log-uniform in min..max, at most `max_live` live.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChurnPhase {
    pub operations: u32,
    pub min_bytes: ByteSize,
    pub max_bytes: ByteSize,
    pub max_live: u32,
}

/// The workloads bundled with the project (from `tuning/workloads/`), by file stem.
pub const BUNDLED: [(&str, &str); 4] = [
    ("training", include_str!("../../tuning/workloads/training.toml")),
    ("serving", include_str!("../../tuning/workloads/serving.toml")),
    ("phase-change", include_str!("../../tuning/workloads/phase-change.toml")),
    ("small-churn", include_str!("../../tuning/workloads/small-churn.toml")),
];

impl WorkloadSpec {
    pub fn from_toml_str(text: &str, file: &str) -> Result<Self, ConfigError> {
        let spec: WorkloadSpec = adaptalloc::config::parse(text, file)?;
        spec.validate(file)?;
        Ok(spec)
    }

    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let (file, text) = adaptalloc::config::read_file(path)?;
        Self::from_toml_str(&text, &file)
    }

    /// A bundled workload by name (see [`BUNDLED`]).
    pub fn bundled(name: &str) -> Option<Self> {
        let (_, text) = BUNDLED.iter().find(|(n, _)| *n == name)?;
        Some(
            Self::from_toml_str(text, &format!("tuning/workloads/{name}.toml"))
                .expect("bundled workloads parse (tested)"),
        )
    }

    fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let bad = |key: &str, value: String, reason: &str| {
            Err(ConfigError::Invalid {
                file: file.into(),
                key: key.into(),
                value,
                reason: reason.into(),
            })
        };
        if self.phases.is_empty() {
            return bad("phase", "[]".into(), "give at least one [[phase]]");
        }
        for p in &self.phases {
            match p {
                Phase::Training(t) if t.layers == 0 || t.activation_bytes.0 == 0 => {
                    return bad(
                        "phase.layers",
                        t.layers.to_string(),
                        "training needs layers > 0 and activation_bytes > 0",
                    );
                }
                Phase::Training(t) if !(0.0..1.0).contains(&t.jitter) => {
                    return bad("phase.jitter", t.jitter.to_string(), "jitter is a fraction in [0, 1)");
                }
                Phase::Serving(s) if s.min_tokens == 0 || s.min_tokens > s.max_tokens || s.kv_block_tokens == 0 => {
                    return bad(
                        "phase.min_tokens",
                        format!("{}..{}", s.min_tokens, s.max_tokens),
                        "need 1 <= min_tokens <= max_tokens and kv_block_tokens > 0",
                    );
                }
                Phase::Serving(s) if s.concurrency == 0 => {
                    return bad("phase.concurrency", "0".into(), "at least one request at a time");
                }
                Phase::Churn(c) if c.min_bytes.0 == 0 || c.min_bytes > c.max_bytes || c.max_live == 0 => {
                    return bad(
                        "phase.min_bytes",
                        format!("{}..{}", c.min_bytes, c.max_bytes),
                        "need 1 <= min_bytes <= max_bytes and max_live > 0",
                    );
                }
                _ => {}
            }
        }
        let events: u128 = self.phases.iter().map(Phase::most_events).sum();
        if events > MAX_EVENTS as u128 {
            return bad(
                "phase",
                format!("up to {events} events"),
                &format!(
                    "a workload may generate at most {MAX_EVENTS} events (40 bytes each in memory); lower steps, layers, requests, max_tokens or operations"
                ),
            );
        }
        Ok(())
    }

    /// Generates the trace. Deterministic in (spec, seed).
    pub fn generate(&self, seed: u64) -> Trace {
        let mut g = Gen {
            events: Vec::new(),
            next_id: 0x1000,
            clock: 0,
            rng: SplitMix64(seed ^ 0x005e_ed0f_ada9),
        };
        for phase in &self.phases {
            match phase {
                Phase::Training(t) => g.training(t),
                Phase::Serving(s) => g.serving(s),
                Phase::Churn(c) => g.churn(c),
            }
        }
        Trace::from_events(self.name.clone(), g.events, false).expect("generated traces are consistent")
    }
}

struct Gen {
    events: Vec<Event>,
    next_id: u64,
    clock: u64,
    rng: SplitMix64,
}

impl Gen {
    fn random(&mut self) -> u64 {
        self.rng.next_u64()
    }

    fn unit(&mut self) -> f64 {
        self.rng.unit()
    }

    fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let (a, b) = ((lo.max(1) as f64).ln(), (hi.max(1) as f64).ln());
        ((a + (b - a) * self.unit()).exp().round() as u64).clamp(lo, hi)
    }

    fn alloc(&mut self, size: u64) -> (u64, u64) {
        let id = self.next_id;
        self.next_id += 0x100;
        self.clock += 1000;
        let size = size.max(1);
        self.events.push(Event {
            op: Op::Alloc,
            timestamp_ns: self.clock,
            id,
            size,
            stream: 0,
        });
        (id, size)
    }

    fn free(&mut self, block: (u64, u64)) {
        self.clock += 1000;
        self.events.push(Event {
            op: Op::Free,
            timestamp_ns: self.clock,
            id: block.0,
            size: block.1,
            stream: 0,
        });
    }

    fn training(&mut self, t: &TrainingPhase) {
        let weights: Vec<_> = (0..t.layers).map(|_| self.alloc(t.weight_bytes.0)).collect();
        let mut optimizer = Vec::new();
        for step in 0..t.steps {
            let scale = 1.0 + t.jitter * (2.0 * self.unit() - 1.0);
            let act = ((t.activation_bytes.0 as f64) * scale) as u64;
            let mut acts = Vec::new();
            for _ in 0..t.layers {
                acts.push(self.alloc(act));
                if t.workspace_bytes.0 > 0 {
                    let ws = self.alloc(t.workspace_bytes.0);
                    self.free(ws);
                }
            }
            let mut grads = Vec::new();
            for a in acts.into_iter().rev() {
                let grad_in = self.alloc(act);
                self.free(a);
                if t.weight_bytes.0 > 0 {
                    grads.push(self.alloc(t.weight_bytes.0));
                }
                self.free(grad_in);
            }
            if step == 0 {
                for _ in 0..(t.layers * t.optimizer_states) {
                    if t.weight_bytes.0 > 0 {
                        optimizer.push(self.alloc(t.weight_bytes.0));
                    }
                }
            }
            for g in grads {
                self.free(g);
            }
        }
        for b in optimizer.into_iter().chain(weights) {
            self.free(b);
        }
    }

    fn serving(&mut self, s: &ServingPhase) {
        struct Request {
            target: u64,
            tokens: u64,
            kv: (u64, u64),
        }
        let weights = (s.weight_bytes.0 > 0).then(|| self.alloc(s.weight_bytes.0));
        let kv_bytes =
            |tokens: u64| tokens.div_ceil(s.kv_block_tokens as u64) * s.kv_block_tokens as u64 * s.kv_bytes_per_token.0;
        let mut started = 0;
        let mut active: Vec<Request> = Vec::new();
        while started < s.requests || !active.is_empty() {
            while started < s.requests && active.len() < s.concurrency as usize {
                let target = self.log_uniform(s.min_tokens as u64, s.max_tokens as u64);
                let prompt = (target / 2).max(1);
                let prefill = self.alloc(prompt * s.temp_bytes_per_token.0);
                let kv = self.alloc(kv_bytes(prompt));
                self.free(prefill);
                active.push(Request {
                    target,
                    tokens: prompt,
                    kv,
                });
                started += 1;
            }
            let step_tokens: u64 = active.iter().map(|r| r.tokens).sum();
            let temp = self.alloc(step_tokens * s.temp_bytes_per_token.0);
            for r in &mut active {
                r.tokens += 1;
                let need = kv_bytes(r.tokens);
                if need > r.kv.1 {
                    // The cache grows by reallocation: new buffer, copy, free the old one.
                    let old = r.kv;
                    r.kv = self.alloc(need);
                    self.free(old);
                }
            }
            self.free(temp);
            let mut i = 0;
            while i < active.len() {
                if active[i].tokens >= active[i].target {
                    let done = active.swap_remove(i);
                    self.free(done.kv);
                } else {
                    i += 1;
                }
            }
        }
        if let Some(w) = weights {
            self.free(w);
        }
    }

    fn churn(&mut self, c: &ChurnPhase) {
        let mut live: Vec<(u64, u64)> = Vec::new();
        for _ in 0..c.operations {
            if live.len() < c.max_live as usize && (live.is_empty() || self.random() % 2 == 0) {
                let size = self.log_uniform(c.min_bytes.0, c.max_bytes.0);
                live.push(self.alloc(size));
            } else {
                let i = (self.random() % live.len() as u64) as usize;
                let b = live.swap_remove(i);
                self.free(b);
            }
        }
        for b in live {
            self.free(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_workloads_parse_and_generate_deterministically() {
        for (name, _) in BUNDLED {
            let spec = WorkloadSpec::bundled(name).unwrap();
            let a = spec.generate(1);
            let b = spec.generate(1);
            assert_eq!(a, b, "{name}: same seed, same trace");
            assert!(a.allocs() > 100, "{name}: {} allocs", a.allocs());
            assert_ne!(a, spec.generate(2), "{name}: seed matters");
        }
    }

    #[test]
    fn bad_specs_name_the_key() {
        let huge = "name = \"x\"\n[[phase]]\nkind = \"training\"\nsteps = 4000000000\nlayers = 4000000000\nweight_bytes = 1\nactivation_bytes = 1\nworkspace_bytes = 1\n";
        let err = WorkloadSpec::from_toml_str(huge, "w.toml").unwrap_err().to_string();
        assert!(
            err.contains("w.toml") && err.contains("at most 20000000 events"),
            "{err}"
        );
        let err = WorkloadSpec::from_toml_str("name = \"x\"\n[[phase]]\nkind = \"training\"\nsteps = 1\n", "w.toml")
            .unwrap_err();
        assert!(err.to_string().contains("w.toml"), "{err}");
        let err = WorkloadSpec::from_toml_str(
            "name = \"x\"\n[[phase]]\nkind = \"churn\"\noperations = 5\nmin_bytes = \"1MiB\"\nmax_bytes = \"1KiB\"\nmax_live = 3\n",
            "w.toml",
        )
        .unwrap_err();
        assert!(err.to_string().contains("phase.min_bytes"), "{err}");
        let err = WorkloadSpec::from_toml_str("name = \"x\"\nbogus = 1\n[[phase]]\nkind = \"churn\"\n", "w.toml")
            .unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }
}
