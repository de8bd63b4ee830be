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

/// Whether this process may run AMX-BF16 tile instructions: the CPU has AMX-TILE and
/// AMX-BF16 (CPUID.(EAX=7,ECX=0):EDX bits 24 and 22), the OS saves the tile state
/// (XCR0 bits 17 and 18), and Linux granted it to the process
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, asked once, here, before
/// any thread uses a tile). False off x86-64 Linux.
pub(crate) fn amx_bf16() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            use std::arch::x86_64::{__cpuid_count, _xgetbv};
            // SAFETY: cpuid exists on every x86-64 CPU; leaf 7 is asked only when the
            // CPU reports it; xgetbv only when CPUID says OSXSAVE (leaf 1 ECX bit 27).
            let has = unsafe {
                let max = __cpuid_count(0, 0).eax;
                let osxsave = __cpuid_count(1, 0).ecx & (1 << 27) != 0;
                let edx = if max >= 7 { __cpuid_count(7, 0).edx } else { 0 };
                let tile_and_bf16 = edx & (1 << 24) != 0 && edx & (1 << 22) != 0;
                tile_and_bf16 && osxsave && _xgetbv(0) & (0b11 << 17) == 0b11 << 17
            };
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a plain system call with integer arguments.
            has && unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            } == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}
