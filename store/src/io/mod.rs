//! Aligned buffers, positional reads (O_DIRECT with buffered fallback) and the I/O engines that
//! read expert records (`docs/IO.md`).
//!
//! Expert records are read by an [`IoEngine`] (io_uring, a pread thread pool, or mmap, chosen at
//! open, see [`IoEngineChoice`]) into [`AlignedBuf`]s. With [`IoMode::Direct`] the segment files
//! are opened with `O_DIRECT`, so reads bypass the page cache; this needs the buffer address, file
//! offset and length to be multiples of the file system's direct-I/O alignment, which the store
//! guarantees for its alignment (FORMAT.md section 3). Whether direct I/O works is decided per
//! store at open: `statx(STATX_DIOALIGN)` when the kernel reports it, then a probe read; on
//! `EINVAL` or a file system without direct I/O (tmpfs, some network file systems)
//! [`IoPreference::Auto`] falls back to buffered reads and logs one note to stderr.

mod counting;
mod engine;
mod layer;
mod mmap;
mod open;
mod pool;
mod pread;
mod uring;

pub use counting::{CountingEngine, EngineStats};
pub use engine::{
    Completion, FileId, IoEngine, IoQueue, ReadError, ReadPiece, ReadProgress, ReadRequest,
    DEFAULT_VERIFY_PIECE_BYTES,
};
pub(crate) use engine::{EngineConfig, EngineFile};
pub use layer::EngineLayer;
pub(crate) use open::open_engine;
pub use open::{io_engine_names, IoEngineChoice};

use std::alloc::Layout;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// How the reader was asked to read expert records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoPreference {
    /// O_DIRECT when the file system supports it at the store's alignment, else buffered
    /// (with one logged note).
    #[default]
    Auto,
    /// O_DIRECT or an error.
    Direct,
    /// Buffered reads through the page cache.
    Buffered,
}

/// How the reader actually reads expert records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT positional reads into aligned buffers.
    Direct,
    /// Buffered positional reads.
    Buffered,
}

/// One anonymous memory mapping holding a fetch buffer; unmaps itself on drop.
///
/// The mapping is exactly `layout.size()` bytes (the buffer's length rounded up to the page
/// size) starting at a multiple of `layout.align()`: the process holds no more than the
/// record it reads (`held`), and the expert cache charges exactly that
/// ([`AlignedBuf::held_bytes`]). Fresh mappings are never written before a read fills them:
/// the kernel hands out anonymous pages zeroed, so the bytes are initialised without the
/// memset an allocator's `alloc_zeroed` would run over every fresh buffer (IO.md section
/// "Buffers").
struct Alloc {
    ptr: std::ptr::NonNull<u8>,
    layout: Layout,
}

// SAFETY: Alloc uniquely owns its mapping (like Box<[u8]>).
unsafe impl Send for Alloc {}

impl Drop for Alloc {
    fn drop(&mut self) {
        // SAFETY: [ptr, ptr + size) is exactly the mapping made in `Alloc::map` (its head and
        // tail slack were unmapped there), owned by this Alloc alone.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.layout.size());
        }
    }
}

/// Buffers at least this large start at a 2 MiB boundary and are advised to use transparent
/// huge pages, so that filling a fresh ~16 MiB record buffer costs a few page faults instead of
/// thousands. Their length is still rounded only to the page size: the tail past the last whole
/// 2 MiB stays in small pages (nothing else is mapped beside it, so no huge page can cover it).
const HUGE: usize = 2 << 20;

/// The page size, bytes.
pub(crate) fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    })
}

/// Bytes of memory a fetch buffer of `len` bytes holds ([`AlignedBuf::held_bytes`]): `len`
/// rounded up to the page size. What the engine's expert cache charges for a record of `len`
/// bytes (an INDEX record length), before reading it.
pub fn held_bytes_for(len: u64) -> u64 {
    let page = page_size() as u64;
    len.max(1).div_ceil(page) * page
}

impl Alloc {
    /// The layout used for a buffer of `len` bytes aligned to `align`: `len` rounded up to the
    /// page size (at least one page), aligned to `align` and the page size, and to 2 MiB from
    /// [`HUGE`] bytes on.
    fn layout_for(len: usize, align: usize) -> Layout {
        let page = page_size();
        let size = len.max(1).div_ceil(page) * page;
        let lay_align = if len >= HUGE {
            align.max(HUGE)
        } else {
            align.max(page)
        };
        Layout::from_size_align(size, lay_align).expect("AlignedBuf: bad layout")
    }

    /// Maps `layout` (anonymous, private, zero-filled by the kernel on first touch; huge-page
    /// advice for large layouts). Aborts like `handle_alloc_error` when the kernel refuses.
    fn map(layout: Layout) -> Alloc {
        let page = page_size();
        let size = layout.size();
        // Over-map by the alignment beyond a page, then unmap the slack before and after the
        // aligned range so that the mapping is exactly `size` bytes.
        let slack = layout.align().saturating_sub(page);
        let total = size + slack;
        // SAFETY: a fresh anonymous private mapping; no existing memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(layout);
        }
        let base = raw as usize;
        let start = base.next_multiple_of(layout.align());
        let head = start - base;
        let tail = total - head - size;
        // SAFETY: [base, start) and [start + size, base + total) lie inside the mapping just
        // made and nothing refers to them; both lengths are multiples of the page size (base,
        // start, size and total all are).
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((start + size) as *mut libc::c_void, tail);
            }
        }
        if size >= HUGE {
            // SAFETY: [start, start + size) is our mapping, 2 MiB-aligned; madvise only sets
            // a hint and its failure is harmless.
            unsafe {
                libc::madvise(start as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
            }
        }
        let ptr = std::ptr::NonNull::new(start as *mut u8).expect("mmap returned null");
        Alloc { ptr, layout }
    }
}

/// A free list of fetch buffers, so that a steady stream of fetches reuses memory instead of
/// mapping and page-faulting ~16 MiB per record (the kernel zeroes every fresh page: that costs
/// as much memory traffic as the checksum). A buffer taken from the pool returns to it when its [`AlignedBuf`] is
/// dropped; at most `max_buffers` idle buffers are kept, the rest are freed.
pub(crate) struct BufPool {
    free: std::sync::Mutex<Vec<Alloc>>,
    max_buffers: usize,
    /// With `Some(n)`: at most `n` allocations ever (idle or handed out), none ever freed while
    /// the pool lives (io_uring registers them; see `uring.rs`).
    limit: Option<usize>,
    allocated: std::sync::atomic::AtomicUsize,
}

impl BufPool {
    /// A pool keeping at most `max_buffers` idle buffers.
    pub(crate) fn new(max_buffers: usize) -> std::sync::Arc<BufPool> {
        std::sync::Arc::new(BufPool {
            free: std::sync::Mutex::new(Vec::new()),
            max_buffers,
            limit: None,
            allocated: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// A pool that allocates at most `limit` buffers in its lifetime and frees none of them
    /// before it is dropped (so their addresses stay valid for a registration with the kernel).
    pub(crate) fn fixed(limit: usize) -> std::sync::Arc<BufPool> {
        std::sync::Arc::new(BufPool {
            free: std::sync::Mutex::new(Vec::new()),
            max_buffers: usize::MAX,
            limit: Some(limit),
            allocated: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Like [`BufPool::get`], but `None` when no idle buffer has the layout and the pool's
    /// allocation limit is reached.
    pub(crate) fn try_get(
        self: &std::sync::Arc<Self>,
        len: usize,
        align: usize,
    ) -> Option<AlignedBuf> {
        let layout = Alloc::layout_for(len, align);
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.iter()
                .position(|a| a.layout == layout)
                .map(|i| free.swap_remove(i))
        };
        let alloc = match reused {
            Some(a) => a,
            None => {
                use std::sync::atomic::Ordering;
                if let Some(limit) = self.limit {
                    let prev = self.allocated.fetch_add(1, Ordering::Relaxed);
                    if prev >= limit {
                        self.allocated.fetch_sub(1, Ordering::Relaxed);
                        return None;
                    }
                }
                Alloc::map(layout)
            }
        };
        Some(AlignedBuf {
            ptr: alloc.ptr,
            alloc: Some(alloc),
            len,
            align,
            pool: Some(self.clone()),
        })
    }

    /// A buffer of `len` bytes aligned to `align`: a recycled one of the same layout when one is
    /// idle (its bytes are those of an earlier record, all initialised), else a fresh mapping
    /// (zero bytes, never written by the process before the read that fills it).
    pub(crate) fn get(self: &std::sync::Arc<Self>, len: usize, align: usize) -> AlignedBuf {
        debug_assert!(self.limit.is_none(), "get on a fixed pool");
        self.try_get(len, align)
            .expect("an unlimited pool always allocates")
    }

    fn put(&self, a: Alloc) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.max_buffers {
            free.push(a);
        }
    }
}

/// A zero-initialised buffer of its own memory mapping whose start address is aligned (to the
/// page size, 4096 bytes, at least), as O_DIRECT needs.
///
/// The length is fixed at creation. The buffer is `Send + Sync` (it owns its memory and only
/// hands out borrows through `&self`/`&mut self`). Buffers handed out by a store's fetch come
/// from its buffer pool and go back to it on drop (their bytes are the record read).
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    /// The owned allocation (`None` while being dropped, and for a buffer over the caller's
    /// memory, see [`AlignedBuf::borrowed`]).
    alloc: Option<Alloc>,
    len: usize,
    align: usize,
    pool: Option<std::sync::Arc<BufPool>>,
}

// SAFETY: AlignedBuf uniquely owns its allocation (like Vec<u8>); shared access is only through
// `&[u8]`, mutation only through `&mut self`.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above; `&AlignedBuf` only gives `&[u8]`, which is Sync.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Default alignment of buffers, bytes.
    pub const DEFAULT_ALIGN: usize = 4096;

    /// Maps `len` zero bytes aligned to `align` bytes (a power of two; at least the page size
    /// is used). Buffers of 2 MiB or more start at a 2 MiB boundary and use transparent huge
    /// pages where the kernel allows; the mapping is `len` rounded up to the page size
    /// ([`AlignedBuf::held_bytes`]).
    ///
    /// # Panics
    /// If `align` is not a power of two or `len` rounded up to `align` overflows `isize`; aborts
    /// when the kernel refuses the mapping (like `Vec` on allocation failure).
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        let alloc = Alloc::map(Alloc::layout_for(len, align));
        AlignedBuf {
            ptr: alloc.ptr,
            alloc: Some(alloc),
            len,
            align,
            pool: None,
        }
    }

    /// A buffer over `len` bytes of memory the caller owns, for a read straight into it. It
    /// never frees that memory and never returns to a pool.
    ///
    /// # Safety
    /// `ptr` is valid for reads and writes of `len` bytes, aligned to `align`, and nothing else
    /// reads or writes that memory until the buffer is dropped.
    pub(crate) unsafe fn borrowed(
        ptr: std::ptr::NonNull<u8>,
        len: usize,
        align: usize,
    ) -> AlignedBuf {
        AlignedBuf {
            ptr,
            alloc: None,
            len,
            align,
            pool: None,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Alignment of the start address, bytes (at least the one asked for).
    pub fn align(&self) -> usize {
        self.align
    }

    /// Bytes of memory the buffer holds: its length rounded up to the page size (the size of
    /// its mapping), or its length for a buffer over the caller's memory. What the expert
    /// cache charges a record.
    pub fn held_bytes(&self) -> usize {
        self.alloc.as_ref().map_or(self.len, |a| a.layout.size())
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (zero-filled by the kernel, since then only
        // written with bytes) for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole allocation behind the buffer, `(start, bytes)`: at least `len()` bytes (a
    /// registration with the kernel covers all of it).
    pub(crate) fn allocation(&self) -> (*mut u8, usize) {
        let size = self.alloc.as_ref().map_or(self.len, |a| a.layout.size());
        (self.ptr.as_ptr(), size)
    }

    /// True when the buffer came from `pool` (and returns there on drop).
    pub(crate) fn is_from(&self, pool: &std::sync::Arc<BufPool>) -> bool {
        self.pool
            .as_ref()
            .is_some_and(|p| std::sync::Arc::ptr_eq(p, pool))
    }

    /// The start of the bytes, for the kernel to write into (io_uring).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and we hold &mut self, so the borrow is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let (Some(pool), Some(a)) = (self.pool.take(), self.alloc.take()) {
            pool.put(a);
        }
        // Otherwise `alloc` frees itself.
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.align)
            .finish()
    }
}

/// Direct-I/O alignment requirements of a file as reported by `statx(STATX_DIOALIGN)`
/// (Linux 6.1+): `(memory alignment, file offset alignment)` in bytes. `None` when the kernel
/// does not report them; `Some((0, 0))` when the file system does not support direct I/O.
pub(crate) fn dio_alignment(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statx is plain data; an all-zero value is valid.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path, `st` a valid out-pointer.
    let rc = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_DIOALIGN, &mut st) };
    if rc != 0 || st.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some((st.stx_dio_mem_align, st.stx_dio_offset_align))
}

/// Opens `path` read-only, with `O_DIRECT` when `direct`.
pub(crate) fn open_read(path: &Path, direct: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

/// Reads exactly `len` bytes at `offset` of `file` into a new buffer aligned to `align`, with one
/// positional read (more only if the kernel returns a short read).
pub(crate) fn read_aligned(
    file: &File,
    offset: u64,
    len: usize,
    align: usize,
) -> std::io::Result<AlignedBuf> {
    let mut buf = AlignedBuf::new(len, align);
    file.read_exact_at(buf.as_mut_slice(), offset)?;
    Ok(buf)
}

/// Decides whether `path` (a segment file of at least `file_len` bytes) can be read with
/// O_DIRECT at offsets and lengths that are multiples of `alignment` (bytes): the file system's
/// direct-I/O alignment from `statx(STATX_DIOALIGN)` when the kernel reports it, then one probe
/// read. Returns the buffer alignment to use on success, or the reason it cannot (what the store
/// decides at open, and what `coli doctor` reports per drive).
///
/// # Errors
/// The reason, as a sentence: no direct I/O on this file system, an alignment mismatch, or the
/// open or read error.
pub fn probe_direct(path: &Path, alignment: usize, file_len: u64) -> Result<usize, String> {
    let mut mem_align = alignment.max(AlignedBuf::DEFAULT_ALIGN);
    if let Some((mem, off)) = dio_alignment(path) {
        if mem == 0 || off == 0 {
            return Err("the file system does not support direct I/O (statx)".into());
        }
        if !alignment.is_multiple_of(off as usize) {
            return Err(format!(
                "the file system needs direct-I/O offsets aligned to {off} bytes but the store's alignment is {alignment}"
            ));
        }
        mem_align = mem_align.max(mem as usize);
    }
    let f = open_read(path, true).map_err(|e| format!("open with O_DIRECT failed: {e}"))?;
    // Probe at offset `alignment` (tests the store's offset granularity) when the file is long
    // enough, else at 0.
    let off = if file_len >= 2 * alignment as u64 {
        alignment as u64
    } else {
        0
    };
    let len = alignment.min(file_len as usize);
    if len > 0 {
        read_aligned(&f, off, len, mem_align)
            .map_err(|e| format!("O_DIRECT probe read failed: {e}"))?;
    }
    Ok(mem_align)
}

/// The process's locked-memory limit (`RLIMIT_MEMLOCK`, soft), bytes; `None` when unlimited
/// (or unreadable).
/// io_uring's registered buffers count against it (kernels before 5.12 always, later ones
/// under memory-cgroup accounting); a refusal leaves reads unregistered, not failed.
pub fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the valid out-pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_recycles_same_layout_and_caps_idle_buffers() {
        let pool = BufPool::new(1);
        let mut a = pool.get(3 << 20, 4096);
        assert_eq!(a.len(), 3 << 20);
        assert_eq!(a.as_ptr() as usize % (2 << 20), 0);
        a.as_mut_slice()[5] = 9;
        let pa = a.as_ptr();
        let a_held = a.held_bytes();
        let b = pool.get(3 << 20, 4096);
        assert_ne!(b.as_ptr(), pa, "a is still live");
        drop(a);
        drop(b); // over the cap of 1: freed
        assert_eq!(pool.free.lock().unwrap().len(), 1);
        // Same layout (3 MiB, 2 MiB-aligned, not rounded further): recycled with its old bytes.
        assert_eq!(a_held, 3 << 20);
        let c = pool.get((3 << 20) - 100, 4096);
        assert_eq!(c.as_ptr(), pa);
        assert_eq!(c[5], 9);
        assert_eq!(c.len(), (3 << 20) - 100);
        assert_eq!(c.held_bytes(), 3 << 20);
        // A different layout is a fresh, zeroed buffer.
        let d = pool.get(8192, 4096);
        assert!(d.iter().all(|&x| x == 0));
        assert_eq!(d.as_ptr() as usize % 4096, 0);
        assert_eq!(pool.free.lock().unwrap().len(), 0);
    }
}
