//! What WeCom's directory costs wxgate to hold (`[directory] max_members`,
//! docs/recipients.md "Broadcasts"): heap bytes per member id held, counted
//! by this example's allocator, for `apps` apps each holding a department
//! of `members` members (as a broadcast to `@all` of a corp of that size
//! leaves them), with userids of `len` bytes.
//!
//! `cargo run --example directory_memory -- 100000 10 12` (members, apps,
//! userid length; those are the defaults). The bytes counted are the
//! held copies only (what `max_members` bounds): each id is its own
//! allocation (its length rounded up by the allocator) plus a 16-byte
//! pointer and length.
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;

use wxgate::features::directory::units::{read, Cache, Held, Unit};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (members, apps, len) = (
        args.first().copied().unwrap_or(100_000),
        args.get(1).copied().unwrap_or(10),
        args.get(2).copied().unwrap_or(12),
    );
    let mut cache = Cache::default();
    let before = LIVE.load(Ordering::Relaxed);
    for app in 0..apps {
        // WeCom's user/simplelist answer, as it comes.
        let users: Vec<String> = (0..members)
            .map(|i| format!(r#"{{"userid":"{:0>len$}","name":"Member","department":[2]}}"#, format!("{app}x{i}")))
            .collect();
        let answer = format!(r#"{{"errcode":0,"errmsg":"ok","userlist":[{}]}}"#, users.join(","));
        drop(users);
        let Ok(held) = read(Unit::Party(2), answer.as_bytes()) else { panic!("not read") };
        drop(answer);
        let key = (Arc::from("wwcorp"), Arc::from(format!("{}", 1_000_002 + app)), Unit::Party(2));
        let held = Held { members: Arc::new(held), until: i64::MAX, refresh_at: i64::MAX, used: 0, refreshing: false };
        assert!(cache.put(key, held, 0, u64::MAX), "held");
    }
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    let ids = cache.weight();
    println!(
        "{apps} apps x {members} members, userids of {len} bytes: {ids} ids held, {:.1} MB of heap, {:.1} bytes per id",
        bytes as f64 / 1e6,
        bytes as f64 / ids as f64
    );
}
