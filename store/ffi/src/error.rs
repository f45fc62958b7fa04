//! Status codes, the per-thread last error message, and the panic guard of every entry point.

use coli_store::StoreError;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Status code returned by every `coli_*` function that can fail (C type `coli_status`,
/// an `int32_t`).
pub type coli_status = i32;

/// Success.
pub const COLI_OK: coli_status = 0;
/// A required pointer argument was NULL.
pub const COLI_ERR_NULL_ARGUMENT: coli_status = 1;
/// An argument is out of range or malformed (bad option value, invalid UTF-8 path, index past
/// the end, inconsistent view).
pub const COLI_ERR_INVALID_ARGUMENT: coli_status = 2;
/// An operating-system I/O error (missing file, permission, read error); the message names the
/// file.
pub const COLI_ERR_IO: coli_status = 3;
/// The store is damaged or not a store: bad magic, crc32, field or bound (message names file and
/// field).
pub const COLI_ERR_FORMAT: coli_status = 4;
/// The store was written by a newer format version than this library reads.
pub const COLI_ERR_NEWER_VERSION: coli_status = 5;
/// The store misses experts listed in its MANIFEST (an interrupted conversion).
pub const COLI_ERR_INCOMPLETE: coli_status = 6;
/// A record, tensor or file failed its checksum (message names it, the file and the offset).
pub const COLI_ERR_CHECKSUM: coli_status = 7;
/// No such expert, layer or dense tensor in this store.
pub const COLI_ERR_NOT_FOUND: coli_status = 8;
/// A caller-provided buffer is too small or not aligned to the store's buffer alignment.
pub const COLI_ERR_BUFFER: coli_status = 9;
/// A requested feature is not supported by this version (reserved; no current call returns it).
pub const COLI_ERR_UNSUPPORTED: coli_status = 10;
/// An internal error (a bug): a Rust panic caught at the boundary, or an unexpected state.
pub const COLI_ERR_PANIC: coli_status = 11;

/// An error on its way to the C caller: a status code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FfiError {
    pub(crate) code: coli_status,
    pub(crate) msg: String,
}

impl FfiError {
    pub(crate) fn new(code: coli_status, msg: impl Into<String>) -> FfiError {
        FfiError {
            code,
            msg: msg.into(),
        }
    }
    pub(crate) fn null(arg: &str, func: &str) -> FfiError {
        FfiError::new(
            COLI_ERR_NULL_ARGUMENT,
            format!("{func}: argument `{arg}` is NULL"),
        )
    }
    pub(crate) fn invalid(msg: impl Into<String>) -> FfiError {
        FfiError::new(COLI_ERR_INVALID_ARGUMENT, msg)
    }
}

impl From<StoreError> for FfiError {
    fn from(e: StoreError) -> FfiError {
        let code = match &e {
            StoreError::Io { .. } => COLI_ERR_IO,
            StoreError::Format(coli_store::FormatError::NewerVersion { .. }) => {
                COLI_ERR_NEWER_VERSION
            }
            StoreError::Format(_) => COLI_ERR_FORMAT,
            StoreError::Incomplete { .. } => COLI_ERR_INCOMPLETE,
            StoreError::Checksum { .. } => COLI_ERR_CHECKSUM,
            StoreError::NotFound(_) => COLI_ERR_NOT_FOUND,
            StoreError::Options(_) => COLI_ERR_INVALID_ARGUMENT,
            StoreError::Writer(_) => COLI_ERR_PANIC,
            // Variants added to the store later map to the generic internal code.
            #[allow(unreachable_patterns)]
            _ => COLI_ERR_PANIC,
        };
        FfiError::new(code, e.to_string())
    }
}

pub(crate) type FfiResult<T> = Result<T, FfiError>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Stores `msg` as this thread's last error (interior NUL bytes become spaces).
pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // `try_with` fails only during thread teardown; there is then nobody to read the message.
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut s) = slot.try_borrow_mut() {
            *s = c;
        }
    });
}

/// Text of a caught panic payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// Runs the body of an entry point: `Ok` gives [`COLI_OK`]; an error or a panic records the
/// message for [`coli_last_error_message`] and gives its status code.
pub(crate) fn guard(func: &str, body: impl FnOnce() -> FfiResult<()>) -> coli_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => COLI_OK,
        Ok(Err(e)) => {
            set_last_error(&e.msg);
            e.code
        }
        Err(payload) => {
            let text = panic_text(payload.as_ref());
            // Dropping the payload could itself panic; forget it (a few bytes, on a bug path).
            std::mem::forget(payload);
            set_last_error(&format!("{func}: internal error (panic): {text}"));
            COLI_ERR_PANIC
        }
    }
}

/// The message of the most recent failed `coli_*` call on the calling thread, as a
/// NUL-terminated UTF-8 string ("" when no call has failed on this thread). Successful calls do
/// not change it. The pointer stays valid until the next failing `coli_*` call on the same
/// thread; copy the text to keep it. Never NULL.
#[no_mangle]
pub extern "C" fn coli_last_error_message() -> *const c_char {
    static EMPTY: &[u8; 1] = b"\0";
    let r = catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| match slot.try_borrow() {
                // The CString's heap buffer lives in the thread-local until replaced.
                Ok(s) => s.as_ptr(),
                Err(_) => EMPTY.as_ptr().cast::<c_char>(),
            })
            .unwrap_or(EMPTY.as_ptr().cast::<c_char>())
    });
    r.unwrap_or(EMPTY.as_ptr().cast::<c_char>())
}

/// A static, NUL-terminated name of a status code (`"COLI_OK"`, `"COLI_ERR_IO"`, ...;
/// `"COLI_ERR_UNKNOWN"` for a value that is no status code). Never NULL; never freed.
#[no_mangle]
pub extern "C" fn coli_status_name(status: coli_status) -> *const c_char {
    let name = |status| -> &'static [u8] {
        match status {
            COLI_OK => b"COLI_OK\0",
            COLI_ERR_NULL_ARGUMENT => b"COLI_ERR_NULL_ARGUMENT\0",
            COLI_ERR_INVALID_ARGUMENT => b"COLI_ERR_INVALID_ARGUMENT\0",
            COLI_ERR_IO => b"COLI_ERR_IO\0",
            COLI_ERR_FORMAT => b"COLI_ERR_FORMAT\0",
            COLI_ERR_NEWER_VERSION => b"COLI_ERR_NEWER_VERSION\0",
            COLI_ERR_INCOMPLETE => b"COLI_ERR_INCOMPLETE\0",
            COLI_ERR_CHECKSUM => b"COLI_ERR_CHECKSUM\0",
            COLI_ERR_NOT_FOUND => b"COLI_ERR_NOT_FOUND\0",
            COLI_ERR_BUFFER => b"COLI_ERR_BUFFER\0",
            COLI_ERR_UNSUPPORTED => b"COLI_ERR_UNSUPPORTED\0",
            COLI_ERR_PANIC => b"COLI_ERR_PANIC\0",
            _ => b"COLI_ERR_UNKNOWN\0",
        }
    };
    let s: &'static [u8] = catch_unwind(|| name(status)).unwrap_or(b"COLI_ERR_UNKNOWN\0");
    s.as_ptr().cast::<c_char>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: coli_last_error_message never returns NULL and points at a NUL-terminated
        // string that lives until the next failing call on this thread.
        unsafe { CStr::from_ptr(coli_last_error_message()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn guard_maps_errors_and_panics() {
        assert_eq!(guard("f", || Ok(())), COLI_OK);
        assert_eq!(
            guard("f", || Err(FfiError::new(COLI_ERR_NOT_FOUND, "no layer 9"))),
            COLI_ERR_NOT_FOUND
        );
        assert_eq!(last(), "no layer 9");
        // A success leaves the message alone.
        assert_eq!(guard("f", || Ok(())), COLI_OK);
        assert_eq!(last(), "no layer 9");
        let code = guard("coli_thing", || panic!("boom {}", 42));
        assert_eq!(code, COLI_ERR_PANIC);
        assert!(
            last().contains("coli_thing") && last().contains("boom 42"),
            "{}",
            last()
        );
    }

    #[test]
    fn messages_are_per_thread_and_nul_safe() {
        set_last_error("main\0thread");
        std::thread::spawn(|| {
            assert_eq!(last(), "");
            set_last_error("other");
            assert_eq!(last(), "other");
        })
        .join()
        .unwrap();
        assert_eq!(last(), "main thread");
    }

    #[test]
    fn status_names() {
        let name = |c| {
            // SAFETY: coli_status_name returns a static NUL-terminated string.
            unsafe { CStr::from_ptr(coli_status_name(c)) }
                .to_str()
                .unwrap()
        };
        assert_eq!(name(COLI_OK), "COLI_OK");
        assert_eq!(name(COLI_ERR_CHECKSUM), "COLI_ERR_CHECKSUM");
        assert_eq!(name(COLI_ERR_PANIC), "COLI_ERR_PANIC");
        assert_eq!(name(-5), "COLI_ERR_UNKNOWN");
    }
}
