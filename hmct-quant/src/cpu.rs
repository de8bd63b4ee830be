//! What this CPU can run: the x86-64 extensions that kernels have hand-written paths
//! for, detected once per process, and the instruction set the wide convolution
//! kernels use.
//!
//! Every kernel asks here rather than probing the CPU itself, so all of them agree
//! on what the machine has. Functions compiled for several targets with
//! `multiversion` pick their clone through that crate's own dispatch instead.

use std::sync::OnceLock;

/// The extensions the kernels use, as this CPU reports them (all false off x86-64).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Features {
    pub avx: bool,
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub avx512f: bool,
}

/// This CPU's features, detected on first use.
#[inline]
pub(crate) fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(detect)
}

fn detect() -> Features {
    #[cfg(target_arch = "x86_64")]
    {
        Features {
            avx: is_x86_feature_detected!("avx"),
            avx2: is_x86_feature_detected!("avx2"),
            fma: is_x86_feature_detected!("fma"),
            f16c: is_x86_feature_detected!("f16c"),
            avx512f: is_x86_feature_detected!("avx512f"),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Features::default()
    }
}

/// The instruction sets the direct convolution and packed GEMM kernels are written
/// for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx2Fma,
    Avx512,
}

impl Isa {
    /// Whether this CPU runs `self`.
    pub(crate) fn supported(self) -> bool {
        let f = features();
        match self {
            Isa::Avx2Fma => f.avx2 && f.fma,
            Isa::Avx512 => f.avx512f,
        }
    }
}

/// The instruction set the wide convolution kernels use: the widest this CPU has, or
/// the one named by the environment variable `HMCT_CONV_ISA` (`avx2` or `avx512`)
/// when the CPU has it, so the two can be timed against each other on one machine.
/// Both give the same bits.
pub(crate) fn conv_isa() -> Option<Isa> {
    static CHOSEN: OnceLock<Option<Isa>> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let requested = match std::env::var("HMCT_CONV_ISA").as_deref() {
            Ok("avx2") => Some(Isa::Avx2Fma),
            Ok("avx512") => Some(Isa::Avx512),
            _ => None,
        };
        match requested {
            Some(isa) if isa.supported() => Some(isa),
            _ => [Isa::Avx512, Isa::Avx2Fma]
                .into_iter()
                .find(|&isa| isa.supported()),
        }
    })
}
