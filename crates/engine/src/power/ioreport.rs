//! macOS: the SoC's energy from IOReport's "Energy Model" channel group, which
//! any user may read (no sudo, unlike `powermetrics`), the way macmon does.
//!
//! NOT COMPILED OR RUN ON MACOS YET. This was written on Linux, where no macOS
//! target is installed: the FFI part below (`#[cfg(target_os = "macos")]`) has
//! never been type-checked or run. The prototypes are those of the private
//! `libIOReport.dylib` as macmon and other readers declare them, and
//! CoreFoundation's public ones. Both libraries are loaded at run time, so a
//! missing symbol is a reason ("IOReport: … has no …"), not a failed start.
//! Only the pure part (which channels count, unit conversion) is tested, on
//! every platform.
//!
//! How: copy the group's channels (`IOReportCopyChannelsInGroup`), subscribe
//! (`IOReportCreateSubscription`), then each interval take a sample
//! (`IOReportCreateSamples`) and the difference to the previous one
//! (`IOReportCreateSamplesDelta`): each channel's integer value in the delta
//! is the energy of the interval, in the unit its label names (mJ, µJ, nJ).

// On other platforms only the tests use these.
#![cfg_attr(not(target_os = "macos"), allow(dead_code))]

/// The channel group with the energy counters.
pub const GROUP: &str = "Energy Model";

/// Whether an "Energy Model" channel is summed: the CPU total ("CPU Energy",
/// or "DIE_n_CPU Energy" per die of an Ultra; its clusters' channels are
/// parts of it), the GPU, the neural engine and DRAM. Other channels are
/// parts of these or not energy.
pub fn counted(channel: &str) -> bool {
    channel.ends_with("CPU Energy")
        || channel == "GPU Energy"
        || channel.starts_with("ANE")
        || channel.starts_with("DRAM")
}

/// µJ of a channel's `value` in `unit` ("mJ", "uJ", "nJ"); `None` for another
/// unit or a negative value (never guessed).
pub fn to_uj(value: i64, unit: &str) -> Option<u64> {
    let v = u64::try_from(value).ok()?;
    match unit.trim() {
        "mJ" => v.checked_mul(1000),
        "uJ" | "µJ" => Some(v),
        "nJ" => Some(v / 1000),
        _ => None,
    }
}

#[cfg(target_os = "macos")]
pub use ffi::IoReport;

#[cfg(target_os = "macos")]
mod ffi {
    use libloading::Library;
    use std::ffi::{c_char, c_void};

    type CfType = *const c_void;
    type CfString = *const c_void;
    type CfDict = *const c_void;
    type CfMutDict = *mut c_void;
    type CfArray = *const c_void;
    type CfIndex = isize;
    type Subscription = *const c_void;
    const UTF8: u32 = 0x0800_0100;

    const IOREPORT: &str = "/usr/lib/libIOReport.dylib";
    const CORE_FOUNDATION: &str = "/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation";

    /// The CoreFoundation functions used (prototypes from CoreFoundation.h;
    /// a null allocator is `kCFAllocatorDefault`).
    struct Cf {
        release: unsafe extern "C" fn(CfType),
        string_create: unsafe extern "C" fn(*const c_void, *const c_char, u32) -> CfString,
        string_get: unsafe extern "C" fn(CfString, *mut c_char, CfIndex, u32) -> u8,
        dict_count: unsafe extern "C" fn(CfDict) -> CfIndex,
        dict_mut_copy: unsafe extern "C" fn(*const c_void, CfIndex, CfDict) -> CfMutDict,
        dict_get: unsafe extern "C" fn(CfDict, *const c_void) -> *const c_void,
        array_count: unsafe extern "C" fn(CfArray) -> CfIndex,
        array_get: unsafe extern "C" fn(CfArray, CfIndex) -> *const c_void,
    }

    /// The IOReport functions used (private; prototypes as macmon declares them).
    struct Ior {
        copy_group: unsafe extern "C" fn(CfString, CfString, u64, u64, u64) -> CfDict,
        subscribe: unsafe extern "C" fn(*const c_void, CfMutDict, *mut CfMutDict, u64, CfType) -> Subscription,
        samples: unsafe extern "C" fn(Subscription, CfMutDict, CfType) -> CfDict,
        delta: unsafe extern "C" fn(CfDict, CfDict, CfType) -> CfDict,
        group: unsafe extern "C" fn(CfDict) -> CfString,
        name: unsafe extern "C" fn(CfDict) -> CfString,
        unit: unsafe extern "C" fn(CfDict) -> CfString,
        integer: unsafe extern "C" fn(CfDict, i32) -> i64,
    }

    /// A subscription to the "Energy Model" group and its last sample.
    pub struct IoReport {
        cf: Cf,
        ior: Ior,
        channels: CfMutDict,
        sub: Subscription,
        prev: CfDict,
        /// The key "IOReportChannels" of a sample.
        key: CfString,
        _libs: (Library, Library),
    }

    // SAFETY: the CF objects are owned by this value alone and used by one
    // thread at a time (the meter's).
    unsafe impl Send for IoReport {}

    impl std::fmt::Debug for IoReport {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("IoReport")
        }
    }

    /// `name` from `lib` (at `path`), as the C prototype `T`.
    ///
    /// # Safety
    /// `T` must be the prototype of `name`.
    unsafe fn get<T: Copy>(lib: &Library, path: &str, name: &str) -> Result<T, String> {
        // SAFETY: the caller gives the prototype.
        let s = unsafe { lib.get::<T>(name.as_bytes()) };
        s.map(|s| *s).map_err(|e| format!("{path} has no {name} ({e})"))
    }

    impl IoReport {
        pub fn open() -> Result<IoReport, String> {
            // SAFETY: system libraries; their initialisers are benign.
            let cf_lib = unsafe { Library::new(CORE_FOUNDATION) }.map_err(|e| format!("{CORE_FOUNDATION}: {e}"))?;
            let ior_lib = unsafe { Library::new(IOREPORT) }.map_err(|e| format!("{IOREPORT}: {e}"))?;
            // SAFETY: each field's type is the prototype of the symbol named.
            let cf = unsafe {
                Cf {
                    release: get(&cf_lib, CORE_FOUNDATION, "CFRelease")?,
                    string_create: get(&cf_lib, CORE_FOUNDATION, "CFStringCreateWithCString")?,
                    string_get: get(&cf_lib, CORE_FOUNDATION, "CFStringGetCString")?,
                    dict_count: get(&cf_lib, CORE_FOUNDATION, "CFDictionaryGetCount")?,
                    dict_mut_copy: get(&cf_lib, CORE_FOUNDATION, "CFDictionaryCreateMutableCopy")?,
                    dict_get: get(&cf_lib, CORE_FOUNDATION, "CFDictionaryGetValue")?,
                    array_count: get(&cf_lib, CORE_FOUNDATION, "CFArrayGetCount")?,
                    array_get: get(&cf_lib, CORE_FOUNDATION, "CFArrayGetValueAtIndex")?,
                }
            };
            // SAFETY: as above.
            let ior = unsafe {
                Ior {
                    copy_group: get(&ior_lib, IOREPORT, "IOReportCopyChannelsInGroup")?,
                    subscribe: get(&ior_lib, IOREPORT, "IOReportCreateSubscription")?,
                    samples: get(&ior_lib, IOREPORT, "IOReportCreateSamples")?,
                    delta: get(&ior_lib, IOREPORT, "IOReportCreateSamplesDelta")?,
                    group: get(&ior_lib, IOREPORT, "IOReportChannelGetGroup")?,
                    name: get(&ior_lib, IOREPORT, "IOReportChannelGetChannelName")?,
                    unit: get(&ior_lib, IOREPORT, "IOReportChannelGetUnitLabel")?,
                    integer: get(&ior_lib, IOREPORT, "IOReportSimpleGetIntegerValue")?,
                }
            };
            // SAFETY: every pointer below is checked for null before use and
            // released once (CF's create/copy rule); `c"…"` strings are NUL-terminated.
            unsafe {
                let group = (cf.string_create)(std::ptr::null(), c"Energy Model".as_ptr(), UTF8);
                let key = (cf.string_create)(std::ptr::null(), c"IOReportChannels".as_ptr(), UTF8);
                if group.is_null() || key.is_null() {
                    return Err("CFStringCreateWithCString failed".into());
                }
                let found = (ior.copy_group)(group, std::ptr::null(), 0, 0, 0);
                (cf.release)(group);
                if found.is_null() {
                    (cf.release)(key);
                    return Err("no \"Energy Model\" channels".into());
                }
                let channels = (cf.dict_mut_copy)(std::ptr::null(), (cf.dict_count)(found), found);
                (cf.release)(found);
                if channels.is_null() {
                    (cf.release)(key);
                    return Err("CFDictionaryCreateMutableCopy failed".into());
                }
                let mut subscribed: CfMutDict = std::ptr::null_mut();
                let sub = (ior.subscribe)(std::ptr::null(), channels, &mut subscribed, 0, std::ptr::null());
                if sub.is_null() {
                    (cf.release)(channels as CfType);
                    (cf.release)(key);
                    return Err("IOReportCreateSubscription failed".into());
                }
                let prev = (ior.samples)(sub, channels, std::ptr::null());
                if prev.is_null() {
                    (cf.release)(sub);
                    (cf.release)(channels as CfType);
                    (cf.release)(key);
                    return Err("IOReportCreateSamples failed".into());
                }
                Ok(IoReport { cf, ior, channels, sub, prev, key, _libs: (cf_lib, ior_lib) })
            }
        }

        fn string(&self, s: CfString) -> String {
            if s.is_null() {
                return String::new();
            }
            let mut buf = [0 as c_char; 128];
            // SAFETY: `buf` holds 128 bytes; CF writes a NUL-terminated string or fails.
            let ok = unsafe { (self.cf.string_get)(s, buf.as_mut_ptr(), buf.len() as CfIndex, UTF8) } != 0;
            if !ok {
                return String::new();
            }
            // SAFETY: CF terminated it.
            unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
        }

        /// Energy of the counted channels since the last call (µJ).
        pub fn energy_since_last_uj(&mut self) -> u64 {
            // SAFETY: `sub`, `channels` and `prev` are live; each new object is
            // released once; the channel items belong to `delta`.
            unsafe {
                let cur = (self.ior.samples)(self.sub, self.channels, std::ptr::null());
                if cur.is_null() {
                    return 0;
                }
                let delta = (self.ior.delta)(self.prev, cur, std::ptr::null());
                (self.cf.release)(self.prev);
                self.prev = cur;
                if delta.is_null() {
                    return 0;
                }
                let items = (self.cf.dict_get)(delta, self.key);
                let mut uj = 0u64;
                if !items.is_null() {
                    for i in 0..(self.cf.array_count)(items) {
                        let item = (self.cf.array_get)(items, i);
                        if item.is_null() || self.string((self.ior.group)(item)) != super::GROUP {
                            continue;
                        }
                        if !super::counted(&self.string((self.ior.name)(item))) {
                            continue;
                        }
                        let unit = self.string((self.ior.unit)(item));
                        uj = uj.saturating_add(super::to_uj((self.ior.integer)(item, 0), &unit).unwrap_or(0));
                    }
                }
                (self.cf.release)(delta);
                uj
            }
        }
    }

    impl Drop for IoReport {
        fn drop(&mut self) {
            // SAFETY: each was created once in `open` or `energy_since_last_uj`.
            unsafe {
                (self.cf.release)(self.prev);
                (self.cf.release)(self.sub);
                (self.cf.release)(self.channels as CfType);
                (self.cf.release)(self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_counted_and_their_parts_are_not() {
        for c in ["CPU Energy", "DIE_0_CPU Energy", "GPU Energy", "ANE", "ANE0", "DRAM", "DRAM0"] {
            assert!(counted(c), "{c}");
        }
        for c in ["PCPU", "ECPU0", "PACC0_CPU", "GPU SRAM", "DISP", "AVE"] {
            assert!(!counted(c), "{c}");
        }
    }

    #[test]
    fn units_convert_to_microjoules() {
        assert_eq!(to_uj(12, "mJ"), Some(12_000));
        assert_eq!(to_uj(12, " uJ "), Some(12));
        assert_eq!(to_uj(12_345, "nJ"), Some(12));
        assert_eq!(to_uj(5, "W"), None);
        assert_eq!(to_uj(-1, "mJ"), None);
    }
}
