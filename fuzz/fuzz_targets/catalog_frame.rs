//! The catalog's wire decoders (`bazaar_catalog::wire`): anti-entropy frames read from a
//! TCP stream (`Authenticator::read_frame`), datagrams (`Keyring::open_datagram`), and the postcard
//! messages inside them (`SyncMsg`, `BroadcastItem`, `Goodbye`, rows through
//! `WireRow::into_row`). Properties: reading a frame never holds more memory than its cap
//! allows (a lying or hostile header allocates nothing); a sealed frame reads back exactly,
//! and refuses any change, a cut or a cap below its length; a sealed datagram opens to what
//! was sealed and refuses any flipped byte; a message that decodes encodes and decodes to
//! the same value; nothing panics.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use bazaar_catalog::keyring::{derived_key, Keyring};
use bazaar_catalog::wire::{self, Authenticator, BroadcastItem, Goodbye, SyncMsg};
use libfuzzer_sys::fuzz_target;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the bytes held, to check what decoding costs in memory.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let held = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(held, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            let held = HELD.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size
                - layout.size();
            PEAK.fetch_max(held, Ordering::Relaxed);
        } else {
            HELD.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns what it returned and the most memory it held at once beyond what
/// was held before.
fn measured<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = HELD.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - before)
}

/// Memory reading a frame may take besides its payload (the header is on the stack).
const FRAME_SLACK: usize = 4096;

#[derive(Debug, Arbitrary)]
enum Input {
    /// Bytes from anyone on the catalog port.
    Stream { cap: u16, bytes: Vec<u8> },
    /// A frame sealed with the cluster secret, then perhaps cut or changed.
    Frame {
        cap: u16,
        sender: String,
        payload: Vec<u8>,
        cut: Option<u16>,
        flip: Option<u16>,
    },
    /// A datagram sealed with the cluster secret, then perhaps changed.
    Datagram {
        kind: u8,
        sender: String,
        seq: u64,
        payload: Vec<u8>,
        flip: Option<u16>,
    },
    /// Bytes from anyone on the gossip port.
    RawDatagram(Vec<u8>),
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
}

fn read_frame(
    auth: &Authenticator,
    mut bytes: &[u8],
    cap: usize,
) -> anyhow::Result<Option<(wire::FrameHeader, Vec<u8>)>> {
    RUNTIME.with(|rt| rt.block_on(auth.read_frame(&mut bytes, cap)))
}

fn seal_frame(auth: &Authenticator, sender: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    RUNTIME
        .with(|rt| rt.block_on(auth.write_frame(&mut out, sender, payload)))
        .expect("sealing a frame");
    out
}

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        // The seeds: messages as the catalog encodes them, sent in a frame and a datagram.
        Some((b'M', payload)) => {
            run(Input::Frame {
                cap: u16::MAX,
                sender: "h1".into(),
                payload: payload.to_vec(),
                cut: None,
                flip: None,
            });
            run(Input::Datagram {
                kind: wire::DGRAM_GOODBYE,
                sender: "h1".into(),
                seq: 1,
                payload: payload.to_vec(),
                flip: None,
            });
        }
        _ => {
            if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) {
                run(input);
            }
        }
    }
});

fn run(input: Input) {
    let auth = Authenticator::new("fuzz-cluster-secret");
    let keys = Keyring::new(&[derived_key("fuzz-cluster-secret")]).expect("one key");
    match input {
        Input::Stream { cap, bytes } => {
            let cap = cap as usize;
            let (read, held) = measured(|| read_frame(&auth, &bytes, cap));
            assert!(
                held <= cap + FRAME_SLACK,
                "held {held} bytes for a cap of {cap}"
            );
            if let Ok(Some((_, payload))) = read {
                messages(&payload);
            }
        }
        Input::Frame {
            cap,
            sender,
            payload,
            cut,
            flip,
        } => {
            if sender.len() > 255 {
                return;
            }
            let cap = cap as usize;
            let mut frame = seal_frame(&auth, &sender, &payload);
            let whole = frame.len();
            if let Some(cut) = cut {
                frame.truncate(cut as usize % whole);
            }
            if let Some(at) = flip {
                let at = at as usize % frame.len().max(1);
                if let Some(b) = frame.get_mut(at) {
                    *b ^= 0x01;
                }
            }
            let changed = frame.len() != whole || flip.is_some() && !frame.is_empty();
            let (read, held) = measured(|| read_frame(&auth, &frame, cap));
            assert!(
                held <= cap + FRAME_SLACK,
                "held {held} bytes for a cap of {cap}"
            );
            match read {
                Ok(Some((header, got))) => {
                    assert!(!changed, "a changed frame was accepted");
                    assert!(payload.len() <= cap);
                    assert_eq!((header.sender.as_str(), &got), (sender.as_str(), &payload));
                    messages(&got);
                }
                // A stream that ends inside the fixed part of a header reads as its end (every
                // caller takes that for a failed exchange).
                Ok(None) => assert!(frame.len() < 13, "a frame read as the end of the stream"),
                Err(_) => assert!(changed || payload.len() > cap, "a good frame was refused"),
            }
        }
        Input::Datagram {
            kind,
            sender,
            seq,
            payload,
            flip,
        } => {
            if sender.len() > 255 {
                return;
            }
            let mut d = keys.seal_datagram(kind, &sender, 1_000, seq, &payload);
            match flip {
                None => {
                    let open = keys.open_datagram(&d).expect("a sealed datagram opens");
                    assert_eq!(
                        (open.kind, open.sender, open.sent_at_ms, &open.payload),
                        (kind, sender.as_str(), 1_000, &payload)
                    );
                    messages(&open.payload);
                }
                Some(at) => {
                    let at = at as usize % d.len();
                    d[at] ^= 0x01;
                    assert_eq!(keys.open_datagram(&d), None, "a changed datagram opened");
                }
            }
        }
        Input::RawDatagram(bytes) => {
            if let Some(open) = keys.open_datagram(&bytes) {
                messages(&open.payload);
            }
        }
    }
}

/// Every message type a payload may carry: those that decode survive a round trip.
fn messages(payload: &[u8]) {
    if let Ok(msg) = wire::decode::<SyncMsg>(payload) {
        assert_eq!(
            wire::decode::<SyncMsg>(&wire::encode(&msg)).ok(),
            Some(msg.clone())
        );
        let rows = match msg {
            SyncMsg::Request { .. } => Vec::new(),
            SyncMsg::Response { rows, .. } | SyncMsg::Push { rows, .. } => rows,
        };
        for row in rows {
            let _ = row.into_row();
        }
    }
    if let Ok(item) = wire::decode::<BroadcastItem>(payload) {
        assert_eq!(
            wire::decode::<BroadcastItem>(&wire::encode(&item)).ok(),
            Some(item.clone())
        );
        if let BroadcastItem::Row(row) = item {
            let _ = row.into_row();
        }
    }
    if let Ok(bye) = wire::decode::<Goodbye>(payload) {
        assert_eq!(wire::decode::<Goodbye>(&wire::encode(&bye)).ok(), Some(bye));
    }
}
