//! A pickle reader for PyTorch memory snapshots (protocols 2 to 5, the opcodes `pickle.dump`
//! writes for dicts, lists, tuples, strings, bytes, numbers and booleans).
//!
//! Why not serde-pickle's: a snapshot shares its frame dicts between entries, and serde-pickle
//! consumes a memoised key on its first use inside such a shared dict, so later copies decode
//! with `None` keys (every frame name of a snapshot's trace was lost). Here containers live in
//! an arena and memo entries are plain handles, so sharing is exact. Nesting deeper than
//! [`MAX_DEPTH`] is an error, not a stack overflow. Objects (`GLOBAL`, `REDUCE`, ...) read as
//! `None`, as serde-pickle's `replace_unresolved_globals` does.

use std::collections::{BTreeMap, HashMap};

use serde_pickle::Value;

/// The deepest nesting read; snapshots nest about 6 deep.
pub const MAX_DEPTH: usize = 200;

#[derive(Clone, Copy, Debug)]
enum V {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// Index into the string arena.
    Str(usize),
    Bytes(usize),
    /// Index into the container arena.
    List(usize),
    Tuple(usize),
    Dict(usize),
    Mark,
}

#[derive(Default)]
struct Arena {
    strings: Vec<String>,
    bytes: Vec<Vec<u8>>,
    seqs: Vec<Vec<V>>,
    dicts: Vec<Vec<(V, V)>>,
}

/// Reads a pickle into a value; errors name the byte offset.
pub fn read(data: &[u8]) -> Result<Value, String> {
    let mut a = Arena::default();
    let mut stack: Vec<V> = Vec::new();
    let mut memo: HashMap<u32, V> = HashMap::new();
    let mut pos = 0usize;
    let take = |pos: &mut usize, n: usize| -> Result<&[u8], String> {
        let end = pos
            .checked_add(n)
            .filter(|&e| e <= data.len())
            .ok_or(format!("truncated at byte {pos}"))?;
        let s = &data[*pos..end];
        *pos = end;
        Ok(s)
    };
    let le = |b: &[u8]| b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64);
    loop {
        let at = pos;
        let op = take(&mut pos, 1)?[0];
        let pop = |stack: &mut Vec<V>| stack.pop().ok_or(format!("stack underflow at byte {at}"));
        let pop_mark = |stack: &mut Vec<V>| -> Result<Vec<V>, String> {
            let m = stack
                .iter()
                .rposition(|v| matches!(v, V::Mark))
                .ok_or(format!("no MARK before byte {at}"))?;
            let items = stack.split_off(m + 1);
            stack.pop();
            Ok(items)
        };
        match op {
            0x80 => {
                take(&mut pos, 1)?;
            }
            0x95 => {
                take(&mut pos, 8)?;
            }
            b'.' => break,
            b'(' => stack.push(V::Mark),
            b'N' => stack.push(V::None),
            0x88 => stack.push(V::Bool(true)),
            0x89 => stack.push(V::Bool(false)),
            b'J' => stack.push(V::Int(le(take(&mut pos, 4)?) as u32 as i32 as i64)),
            b'K' => stack.push(V::Int(take(&mut pos, 1)?[0] as i64)),
            b'M' => stack.push(V::Int(le(take(&mut pos, 2)?) as i64)),
            0x8a | 0x8b => {
                let n = if op == 0x8a {
                    take(&mut pos, 1)?[0] as usize
                } else {
                    le(take(&mut pos, 4)?) as usize
                };
                let b = take(&mut pos, n)?;
                if n > 8 {
                    return Err(format!("integer of {n} bytes at byte {at}"));
                }
                let mut v = le(b);
                if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                    v |= u64::MAX << (8 * n);
                }
                stack.push(V::Int(v as i64));
            }
            b'G' => {
                let b: [u8; 8] = take(&mut pos, 8)?.try_into().expect("8 bytes");
                stack.push(V::Float(f64::from_be_bytes(b)));
            }
            0x8c | b'X' | 0x8d => {
                let n = match op {
                    0x8c => take(&mut pos, 1)?[0] as usize,
                    b'X' => le(take(&mut pos, 4)?) as usize,
                    _ => le(take(&mut pos, 8)?) as usize,
                };
                let s = std::str::from_utf8(take(&mut pos, n)?).map_err(|_| format!("bad UTF-8 at byte {at}"))?;
                a.strings.push(s.to_string());
                stack.push(V::Str(a.strings.len() - 1));
            }
            b'C' | b'B' | 0x8e => {
                let n = match op {
                    b'C' => take(&mut pos, 1)?[0] as usize,
                    b'B' => le(take(&mut pos, 4)?) as usize,
                    _ => le(take(&mut pos, 8)?) as usize,
                };
                a.bytes.push(take(&mut pos, n)?.to_vec());
                stack.push(V::Bytes(a.bytes.len() - 1));
            }
            b'}' => {
                a.dicts.push(Vec::new());
                stack.push(V::Dict(a.dicts.len() - 1));
            }
            b']' => {
                a.seqs.push(Vec::new());
                stack.push(V::List(a.seqs.len() - 1));
            }
            b')' => {
                a.seqs.push(Vec::new());
                stack.push(V::Tuple(a.seqs.len() - 1));
            }
            0x85..=0x87 | b't' => {
                let items = if op == b't' {
                    pop_mark(&mut stack)?
                } else {
                    let n = (op - 0x84) as usize;
                    if stack.len() < n {
                        return Err(format!("stack underflow at byte {at}"));
                    }
                    stack.split_off(stack.len() - n)
                };
                a.seqs.push(items);
                stack.push(V::Tuple(a.seqs.len() - 1));
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let v = pop(&mut stack)?;
                    let k = pop(&mut stack)?;
                    vec![k, v]
                } else {
                    pop_mark(&mut stack)?
                };
                let Some(V::Dict(d)) = stack.last().copied() else {
                    return Err(format!("SETITEMS on a non-dict at byte {at}"));
                };
                a.dicts[d].extend(items.chunks(2).filter(|c| c.len() == 2).map(|c| (c[0], c[1])));
            }
            b'a' | b'e' => {
                let items = if op == b'a' {
                    vec![pop(&mut stack)?]
                } else {
                    pop_mark(&mut stack)?
                };
                let Some(V::List(l)) = stack.last().copied() else {
                    return Err(format!("APPENDS on a non-list at byte {at}"));
                };
                a.seqs[l].extend(items);
            }
            0x94 => {
                let top = *stack.last().ok_or(format!("MEMOIZE on an empty stack at byte {at}"))?;
                memo.insert(memo.len() as u32, top);
            }
            b'q' | b'r' => {
                let id = if op == b'q' {
                    take(&mut pos, 1)?[0] as u32
                } else {
                    le(take(&mut pos, 4)?) as u32
                };
                let top = *stack.last().ok_or(format!("PUT on an empty stack at byte {at}"))?;
                memo.insert(id, top);
            }
            b'h' | b'j' => {
                let id = if op == b'h' {
                    take(&mut pos, 1)?[0] as u32
                } else {
                    le(take(&mut pos, 4)?) as u32
                };
                stack.push(*memo.get(&id).ok_or(format!("memo {id} missing at byte {at}"))?);
            }
            // Objects: a global and what builds it read as None.
            b'c' => {
                for _ in 0..2 {
                    while take(&mut pos, 1)?[0] != b'\n' {}
                }
                stack.push(V::None);
            }
            0x93 => {
                pop(&mut stack)?;
                pop(&mut stack)?;
                stack.push(V::None);
            }
            b'R' | 0x81 | b'b' => {
                pop(&mut stack)?;
                pop(&mut stack)?;
                stack.push(V::None);
            }
            _ => return Err(format!("unsupported pickle opcode {op:#04x} at byte {at}")),
        }
    }
    let top = stack.pop().ok_or("empty pickle")?;
    let mut budget = Budget {
        left: data.len().saturating_mul(EXPANSION).max(MIN_BUDGET),
        input: data.len(),
    };
    convert(&a, top, 0, &mut budget)
}

/// How much larger than its pickle a decoded value may be, in [`Budget`] units (a node, or 32
/// bytes of a string) per input byte. Shared references are expanded into copies, as snapshots
/// share frame dicts between entries: the 13 snapshots in ../shared/traces expand to 0.5 to 3.5
/// units a byte. A pickle of lists that each hold the one below twice, 40 deep, would expand
/// to 2^41 nodes from a few hundred bytes, and is refused instead.
pub const EXPANSION: usize = 16;
/// The budget of a small pickle.
const MIN_BUDGET: usize = 1 << 20;

/// The decoded nodes left to a read: each copy of a shared reference is charged again, so the
/// time and memory a read takes stay proportional to its input.
struct Budget {
    left: usize,
    input: usize,
}

impl Budget {
    fn charge(&mut self, units: usize) -> Result<(), String> {
        self.left = self.left.checked_sub(units).ok_or_else(|| {
            format!(
                "its shared references expand to more than {EXPANSION} values a byte of its {} bytes: not a PyTorch memory snapshot",
                self.input
            )
        })?;
        Ok(())
    }
}

fn convert(a: &Arena, v: V, depth: usize, budget: &mut Budget) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "nested deeper than {MAX_DEPTH} levels: not a PyTorch memory snapshot"
        ));
    }
    budget.charge(1)?;
    let mut seq = |i: usize| {
        a.seqs[i]
            .iter()
            .map(|&x| convert(a, x, depth + 1, budget))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(match v {
        V::None | V::Mark => Value::None,
        V::Bool(b) => Value::Bool(b),
        V::Int(i) => Value::I64(i),
        V::Float(f) => Value::F64(f),
        V::Str(i) => {
            budget.charge(a.strings[i].len() / 32)?;
            Value::String(a.strings[i].clone())
        }
        V::Bytes(i) => {
            budget.charge(a.bytes[i].len() / 32)?;
            Value::Bytes(a.bytes[i].clone())
        }
        V::List(i) => Value::List(seq(i)?),
        V::Tuple(i) => Value::Tuple(seq(i)?),
        V::Dict(i) => {
            let mut m = BTreeMap::new();
            for &(k, x) in &a.dicts[i] {
                let key = convert(a, k, depth + 1, budget)?
                    .into_hashable()
                    .map_err(|_| "a list or dict used as a dict key".to_string())?;
                m.insert(key, convert(a, x, depth + 1, budget)?);
            }
            Value::Dict(m)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_pickle::HashableValue;

    #[test]
    fn shared_dicts_keep_their_keys_and_deep_nesting_is_an_error() {
        // pickle.dumps({'a': [d, d]}, protocol=4) with d = {'k': 1}: the second d is a memo get.
        let p: &[u8] =
            b"\x80\x04\x95\x17\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94]\x94(}\x94\x8c\x01k\x94K\x01sh\x03es.";
        let v = read(p).unwrap();
        let Value::Dict(root) = v else { panic!("dict") };
        let Value::List(l) = &root[&HashableValue::String("a".into())] else {
            panic!("list")
        };
        assert_eq!(l.len(), 2);
        for d in l {
            let Value::Dict(d) = d else { panic!("dict") };
            assert_eq!(d.get(&HashableValue::String("k".into())), Some(&Value::I64(1)));
        }
        let deep = [b"\x80\x04".as_slice(), &[b']'; 10_000], &[b'a'; 9_999], b"."].concat();
        let e = read(&deep).unwrap_err();
        assert!(e.contains("nested deeper"), "{e}");
        assert!(read(b"\x80\x04}").unwrap_err().contains("truncated"));
    }

    /// Shared references are charged per copy: lists that each hold the one below twice, 40
    /// deep (254 bytes, what `pickle.dumps` writes), are refused within the budget instead of
    /// expanding to 2^41 nodes; 12 deep (8,191 nodes) still reads.
    #[test]
    fn shared_references_expand_within_a_budget_proportional_to_the_input() {
        let deep = include_bytes!("../../../fuzz/seeds/snapshot/shared-lists-40-deep.pickle");
        let start = std::time::Instant::now();
        let e = read(deep).unwrap_err();
        assert!(e.contains("shared references expand"), "{e}");
        assert!(start.elapsed().as_secs() < 10, "bounded time: {:?}", start.elapsed());
        fn count(v: &Value) -> usize {
            match v {
                Value::List(l) => 1 + l.iter().map(count).sum::<usize>(),
                _ => 1,
            }
        }
        // The same shape 12 deep: an empty list, then 12 times `[x, x]` with x memoised.
        let mut p = b"\x80\x04]\x94".to_vec();
        for level in 0..12u8 {
            p.extend_from_slice(&[b']', 0x94, b'(', b'h', level, b'h', level, b'e']);
        }
        p.push(b'.');
        assert_eq!(count(&read(&p).unwrap()), (1 << 13) - 1);
    }
}
