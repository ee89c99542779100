//! Tests of the page bookkeeping (`PageMap`).

use super::*;

#[test]
fn pages_follow_live_blocks() {
    let mut m = PageMap::new(8 << 20, 2 << 20);
    assert_eq!(m.unmapped_runs(1 << 20, 3 << 20), vec![(0, 4 << 20)]);
    m.mark_mapped(0, 8 << 20, 2 << 20);
    assert_eq!((m.mapped_bytes, m.unused_mapped_bytes), (8 << 20, 8 << 20));
    m.acquire(1 << 20, 3 << 20); // pages 0 and 1
    m.acquire(3 << 20, 1 << 20); // page 1
    assert_eq!(m.unused_mapped_bytes, 4 << 20);
    m.release(1 << 20, 3 << 20);
    assert_eq!(m.unused_mapped_bytes, 6 << 20, "page 0 free again, page 1 still used");
    let runs = m.take_unused_runs(u64::MAX);
    assert_eq!(runs, vec![(0, 2 << 20), (4 << 20, 4 << 20)]);
    assert_eq!((m.mapped_bytes, m.unused_mapped_bytes), (2 << 20, 0));
    assert_eq!(m.unmapped_runs(0, 6 << 20), vec![(0, 2 << 20), (4 << 20, 2 << 20)]);
}

/// A handle of three pages goes back whole, only once no live block touches any of them;
/// a block on one of its pages pins that page (out of memory, the handle is split and the
/// rest goes back), and keeps the whole handle from the idle bytes.
#[test]
fn a_handle_of_pages_is_pinned_and_released_whole() {
    const P: u64 = 2 << 20;
    let mut m = PageMap::new(8 * P, P);
    m.mark_mapped(0, 3 * P, 3 * P);
    m.mark_mapped(3 * P, P, P);
    assert_eq!(m.unmapped_runs(0, 8 * P), vec![(4 * P, 4 * P)]);
    assert_eq!(m.unpinned_bytes(P, 1), P, "one byte on the handle pins its page");
    assert_eq!(
        m.unpinned_bytes(2 * P, 3 * P),
        3 * P,
        "a page of the handle, the page, an unmapped page"
    );
    assert_eq!(m.acquire(P, 1), P);
    assert_eq!(m.unused_mapped_bytes, P, "the handle is no longer idle; the page is");
    assert_eq!(m.acquire(2 * P, 2 * P), 2 * P, "a page of the handle, and the page");
    assert_eq!(m.unpinned_bytes(0, 3 * P), P, "page 0 is untouched");
    assert_eq!(
        m.live_handle_at(1),
        Some((0, 3)),
        "page 1 is in the handle of pages 0-2"
    );
    assert_eq!(m.live_handle_at(3), Some((3, 1)));
    assert_eq!(m.live_handle_at(4), None, "not mapped");
    assert_eq!(m.release(P, 1), P, "its page is free; another block touches the handle");
    assert_eq!(m.unused_mapped_bytes, 0);
    assert_eq!(m.release(3 * P, P), P);
    assert_eq!(m.live_handle_at(3), None, "no live block: not held");
    m.acquire(3 * P, P);
    assert_eq!(m.take_unused_runs(u64::MAX), vec![], "nothing is wholly unused");
    assert_eq!(m.release(2 * P, 2 * P), 2 * P);
    assert_eq!((m.mapped_bytes, m.unused_mapped_bytes), (4 * P, 4 * P));
    assert_eq!(
        m.take_unused_runs(1),
        vec![(0, 3 * P)],
        "a whole handle, past what was asked"
    );
    assert_eq!(m.take_unused_runs(u64::MAX), vec![(3 * P, P)]);
    assert_eq!((m.mapped_bytes, m.unused_mapped_bytes), (0, 0));
}

/// A slab mapped in one handle counts its touched pages without walking them, and agrees
/// with the same handle among others; a split leaves the live pages as handles of their own.
#[test]
fn one_handle_over_the_slab_counts_as_any_handle() {
    const P: u64 = 2 << 20;
    let mut one = PageMap::new(6 * P, P);
    one.mark_mapped(0, 6 * P, 6 * P);
    let mut two = PageMap::new(7 * P, P);
    two.mark_mapped(0, 6 * P, 6 * P);
    two.mark_mapped(6 * P, P, P);
    for m in [&mut one, &mut two] {
        assert_eq!(m.acquire(P / 2, P), 2 * P, "pages 0 and 1");
        assert_eq!(m.acquire(P, P / 2), 0);
        assert_eq!(m.unused_mapped_bytes, m.mapped_bytes - 6 * P, "the handle is held");
        assert_eq!(m.partly_live_handles(), vec![(0, 6, 2)]);
        assert_eq!(m.release(P / 2, P), P, "page 0 is free; page 1 is not");
        assert_eq!(m.live_pages_of(0), vec![P]);
        assert!(!m.pages_only());
        assert_eq!(m.split(0), 5 * P);
        assert!(m.pages_only(), "every handle left is a page: a donor of moved pages");
        assert_eq!(m.live_handle_at(1), Some((1, 1)));
        assert_eq!(m.release(P, P / 2), P);
        assert_eq!(m.take_unused_runs(u64::MAX)[0], (P, P));
    }
    assert_eq!((one.mapped_bytes, two.mapped_bytes), (0, 0));
}

/// An idle handle that a block would cover only part of is taken back; one inside the
/// block's pages, or one a live block holds, stays.
#[test]
fn overhanging_idle_handles_are_taken_back() {
    const P: u64 = 2 << 20;
    let mut m = PageMap::new(12 * P, P);
    m.mark_mapped(0, 4 * P, 4 * P); // pages 0-3
    m.mark_mapped(4 * P, 2 * P, 2 * P); // pages 4-5
    m.mark_mapped(6 * P, 4 * P, 4 * P); // pages 6-9
    m.acquire(9 * P, 1); // a live block on the last handle
    // A block on pages 3..6 (a byte into page 3 to the middle of page 5).
    let taken = m.take_unused_overhanging(3 * P + 1, 2 * P + 100);
    assert_eq!(taken, vec![(0, 4 * P)], "pages 0-3 overhang; 4-5 lie inside the block");
    assert!(!m.overhangs_idle(7 * P, P));
    assert_eq!(m.take_unused_overhanging(7 * P, P), vec![], "pages 6-9 are held");
    assert!(m.overhangs_idle(5 * P, 2 * P), "pages 4-5 reach before page 5");
    assert_eq!(m.mapped_bytes, 6 * P);
    assert_eq!(m.unused_mapped_bytes, 2 * P);
}

/// The handles and live pages of a slab, kept simply: each page's handle as (first page,
/// pages), and each page's live blocks.
struct Model {
    handle: Vec<Option<(usize, usize)>>,
    refs: Vec<u32>,
}

impl Model {
    fn live(&self, (first, n): (usize, usize)) -> bool {
        (first..first + n).any(|q| self.refs[q] > 0)
    }
    /// Distinct handles over `pages`, in order.
    fn handles_over(&self, pages: std::ops::Range<usize>) -> Vec<(usize, usize)> {
        let mut hs: Vec<(usize, usize)> = pages.filter_map(|q| self.handle[q]).collect();
        hs.dedup();
        hs
    }
    fn unmap(&mut self, (first, n): (usize, usize)) {
        for q in first..first + n {
            self.handle[q] = None;
        }
    }
}

fn pages(off: u64, len: u64, page: u64, n: usize) -> std::ops::Range<usize> {
    (off / page) as usize..((off + len).div_ceil(page) as usize).min(n)
}

proptest::proptest! {
    /// Mapping handles of 1 to 3 pages, placing and freeing blocks, and giving handles
    /// back: every count, and what a block would pin, as the simple model says.
    #[test]
    fn handles_match_a_simple_model(
        ops in proptest::collection::vec((0u8..6, 0usize..16, 1usize..7, 1usize..4), 1..300)
    ) {
        const P: u64 = 2 << 20;
        const N: usize = 16;
        let mut m = PageMap::new(N as u64 * P, P);
        let mut model = Model { handle: vec![None; N], refs: vec![0; N] };
        let mut blocks: Vec<(u64, u64)> = Vec::new();
        for (op, at, len, per) in ops {
            // A block a third of a page into page `at`, over about `len` half pages.
            let (off, bytes) = (at as u64 * P + P / 3, len as u64 * P / 2);
            match op {
                0 => {
                    let end = (at + len).min(N);
                    let n = (end - at) / per * per;
                    if n == 0 || (at..at + n).any(|q| model.handle[q].is_some()) {
                        continue;
                    }
                    m.mark_mapped(at as u64 * P, n as u64 * P, per as u64 * P);
                    for f in (at..at + n).step_by(per) {
                        for q in f..f + per {
                            model.handle[q] = Some((f, per));
                        }
                    }
                }
                1 => {
                    let span = pages(off, bytes, P, N);
                    if off + bytes > N as u64 * P || span.clone().any(|q| model.handle[q].is_none()) {
                        continue;
                    }
                    let newly = span.clone().filter(|&q| model.refs[q] == 0).count() as u64 * P;
                    let idle_before = m.unused_mapped_bytes;
                    let held: u64 = model
                        .handles_over(span.clone())
                        .into_iter()
                        .filter(|&h| !model.live(h))
                        .map(|(_, n)| n as u64 * P)
                        .sum();
                    proptest::prop_assert_eq!(m.unpinned_bytes(off, bytes), newly);
                    proptest::prop_assert_eq!(m.acquire(off, bytes), newly);
                    proptest::prop_assert_eq!(idle_before - m.unused_mapped_bytes, held);
                    for q in span {
                        model.refs[q] += 1;
                    }
                    blocks.push((off, bytes));
                }
                2 if !blocks.is_empty() => {
                    let (off, bytes) = blocks.swap_remove(at % blocks.len());
                    let span = pages(off, bytes, P, N);
                    for q in span.clone() {
                        model.refs[q] -= 1;
                    }
                    let untouched = span.clone().filter(|&q| model.refs[q] == 0).count() as u64 * P;
                    let freed: u64 = model
                        .handles_over(span)
                        .into_iter()
                        .filter(|&h| !model.live(h))
                        .map(|(_, n)| n as u64 * P)
                        .sum();
                    let idle_before = m.unused_mapped_bytes;
                    proptest::prop_assert_eq!(m.release(off, bytes), untouched);
                    proptest::prop_assert_eq!(m.unused_mapped_bytes - idle_before, freed);
                }
                3 => {
                    let want = len as u64 * P;
                    let mut found = 0;
                    let mut expect: Vec<(u64, u64)> = Vec::new();
                    for h in model.handles_over(0..N) {
                        if found >= want {
                            break;
                        }
                        if !model.live(h) {
                            let (start, bytes) = (h.0 as u64 * P, h.1 as u64 * P);
                            match expect.last_mut() {
                                Some((s, l)) if *s + *l == start => *l += bytes,
                                _ => expect.push((start, bytes)),
                            }
                            found += bytes;
                            model.unmap(h);
                        }
                    }
                    proptest::prop_assert_eq!(m.take_unused_runs(want), expect);
                }
                5 => {
                    // Split a handle live blocks touch in part: its live pages become
                    // handles of their own, the rest is unmapped.
                    let partly: Vec<(usize, usize, usize)> = model
                        .handles_over(0..N)
                        .into_iter()
                        .filter(|&(f, n)| n > 1 && model.live((f, n)))
                        .map(|(f, n)| (f, n, (f..f + n).filter(|&q| model.refs[q] > 0).count()))
                        .filter(|&(_, n, live)| live < n)
                        .collect();
                    proptest::prop_assert_eq!(m.partly_live_handles(), partly.clone());
                    let full: Vec<(usize, usize)> = model
                        .handles_over(0..N)
                        .into_iter()
                        .filter(|&(f, n)| n > 1 && (f..f + n).all(|q| model.refs[q] > 0))
                        .collect();
                    proptest::prop_assert_eq!(m.fully_live_handles_over(0, N as u64 * P), full);
                    let Some(&(f, n, live)) = partly.get(at % partly.len().max(1)) else {
                        continue;
                    };
                    let kept: Vec<u64> = (0..n).filter(|&i| model.refs[f + i] > 0).map(|i| i as u64 * P).collect();
                    proptest::prop_assert_eq!(m.live_pages_of(f), kept);
                    proptest::prop_assert_eq!(m.split(f), (n - live) as u64 * P);
                    for q in f..f + n {
                        model.handle[q] = (model.refs[q] > 0).then_some((q, 1));
                    }
                }
                _ => {
                    let span = pages(off, bytes, P, N);
                    if off + bytes > N as u64 * P {
                        continue;
                    }
                    let over: Vec<(usize, usize)> = model
                        .handles_over(span.clone())
                        .into_iter()
                        .filter(|&(f, n)| n > 1 && !model.live((f, n)) && (f < span.start || f + n > span.end))
                        .collect();
                    proptest::prop_assert_eq!(m.overhangs_idle(off, bytes), !over.is_empty());
                    let expect: Vec<(u64, u64)> = over.iter().map(|&(f, n)| (f as u64 * P, n as u64 * P)).collect();
                    proptest::prop_assert_eq!(m.take_unused_overhanging(off, bytes), expect);
                    for h in over {
                        model.unmap(h);
                    }
                }
            }
            let handles = model.handles_over(0..N);
            let mapped: u64 = handles.iter().map(|&(_, n)| n as u64 * P).sum();
            let idle: u64 = handles.iter().filter(|&&h| !model.live(h)).map(|&(_, n)| n as u64 * P).sum();
            proptest::prop_assert_eq!((m.mapped_bytes, m.unused_mapped_bytes), (mapped, idle));
            for q in 0..N {
                let held = model.handle[q].filter(|&h| model.live(h));
                proptest::prop_assert_eq!(m.live_handle_at(q), held);
            }
        }
    }
}

/// Handles that overlap the excepted range (the block being mapped) are passed over; the
/// rest go as `take_unused_runs` would take them.
#[test]
fn handles_under_the_block_are_not_taken() {
    const P: u64 = 2 << 20;
    let mut m = PageMap::new(8 * P, P);
    m.mark_mapped(0, 8 * P, P);
    m.acquire(6 * P, P);
    // Pages 0-5 idle, 6 live, 7 idle; the block being mapped covers part of pages 1-2.
    assert_eq!(
        m.take_unused_runs_except(u64::MAX, P + P / 2..3 * P),
        vec![(0, P), (3 * P, 3 * P), (7 * P, P)]
    );
    assert_eq!(m.mapped_bytes, 3 * P, "pages 1, 2 and 6 stay");
    assert_eq!(m.take_unused_runs_except(u64::MAX, 0..0), vec![(P, 2 * P)]);
}
