//! Splitting a sweep over machines (`--shard I/N`) and checking the parts before
//! they are merged.
//!
//! A sweep's candidates are independent and their figures deterministic, so a
//! sweep splits exactly: shard `I` of `N` runs a fixed subset of the candidates and
//! writes a part; merging the `N` parts gives the unsharded result bit for bit.
//!
//! The subsets are balanced by estimated cost rather than by count, so that the
//! shards end together: a candidate costs the floating-point work of the nodes a
//! probe re-runs (its *cone*), estimated from the shapes of one float run
//! ([`node_costs`]). Candidates that switch the same calibration nodes run as one
//! probe and go to the same shard. The assignment ([`partition`]) is greedy, largest
//! first, onto the least loaded shard, ties broken by position, so every process
//! computes the same split from the same model and data.
//!
//! A part records what it was computed from ([`PartInfo`]): the SHA-256 of the model
//! file and of the samples used, the options, the shard and the number of
//! candidates; [`check_parts`] refuses parts that disagree on any of them, and a
//! missing or duplicated shard, naming which.

use std::fmt;
use std::str::FromStr;

use hmct_quant::{Base, Slot};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::{Engine, EngineError};

/// One shard of `count`, `index` 1-based (`I/N` on the command line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("shard '{0}' is not I/N with 1 <= I <= N (e.g. 2/8)")]
    Syntax(String),
}

impl Shard {
    /// Checked: `1 <= index <= count`.
    pub fn new(index: usize, count: usize) -> Result<Shard, ShardError> {
        if index == 0 || index > count {
            return Err(ShardError::Syntax(format!("{index}/{count}")));
        }
        Ok(Shard { index, count })
    }
}

impl FromStr for Shard {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ShardError::Syntax(s.to_string());
        let (i, n) = s.trim().split_once('/').ok_or_else(bad)?;
        let i: usize = i.trim().parse().map_err(|_| bad())?;
        let n: usize = n.trim().parse().map_err(|_| bad())?;
        Shard::new(i, n).map_err(|_| bad())
    }
}

/// The shard (0-based) of each item: largest cost first onto the least loaded
/// shard; equal costs in item order, equal loads to the lower shard. Every item gets
/// exactly one shard, and the result depends only on `costs` and `count`.
pub fn partition(costs: &[u64], count: usize) -> Vec<usize> {
    let count = count.max(1);
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by(|&a, &b| costs[b].cmp(&costs[a]).then(a.cmp(&b)));
    let mut load = vec![0u64; count];
    let mut shard_of = vec![0; costs.len()];
    for item in order {
        let (shard, _) = load
            .iter()
            .enumerate()
            .min_by_key(|&(s, l)| (*l, s))
            .expect("count >= 1");
        shard_of[item] = shard;
        // Free candidates (nothing to re-run) still count one, so they spread too.
        load[shard] += costs[item].max(1);
    }
    shard_of
}

/// Items grouped by `key` (items with equal keys run as one probe and must share
/// a shard), then [`partition`]ed by group cost: the 0-based shard of each item.
pub fn partition_groups<K: PartialEq>(keys: &[K], costs: &[u64], count: usize) -> Vec<usize> {
    let mut group_of = Vec::with_capacity(keys.len());
    let mut first: Vec<usize> = Vec::new();
    let mut group_cost: Vec<u64> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        match first.iter().position(|&f| keys[f] == *k) {
            Some(g) => group_of.push(g),
            None => {
                first.push(i);
                // One probe: the cost is paid once.
                group_cost.push(costs[i]);
                group_of.push(first.len() - 1);
            }
        }
    }
    let shards = partition(&group_cost, count);
    group_of.into_iter().map(|g| shards[g]).collect()
}

/// Estimated floating-point work of each plan node: the elements it produces,
/// times the reduction length for Conv, ConvTranspose, MatMul and Gemm, with the
/// shapes of a float run of sample 0 (which the engine caches for the probes
/// anyway).
pub fn node_costs(engine: &Engine) -> Result<Vec<u64>, EngineError> {
    let values = engine.capture(0, Base::Float)?;
    let plan = engine.plan();
    // The capture leaves out the intermediate values of element-wise chains, which
    // have a shape of their own only when they broadcast: recomputed here.
    let shape = |slot: Option<Slot>| -> Option<Vec<usize>> {
        let s = slot?;
        match values.get(s).or_else(|| plan.constant(s)) {
            Some(t) => Some(t.shape().to_vec()),
            None => engine
                .captured_value(&values, Base::Float, s)
                .ok()
                .map(|t| t.shape().to_vec()),
        }
    };
    Ok(plan
        .nodes()
        .iter()
        .map(|node| {
            let produced: usize = node
                .outputs
                .iter()
                .filter_map(|&s| shape(Some(s)))
                .map(|d| d.iter().product::<usize>())
                .sum();
            let input = |i: usize| shape(node.inputs.get(i).copied().flatten());
            let reduction = match node.op_type.as_str() {
                // Weight (M, C/g, k...): each output element sums C/g * k... products.
                "Conv" => input(1).map(|w| w[1..].iter().product()),
                // Weight (C, M/g, k...): each input element feeds M/g * k... outputs;
                // counted against the output, roughly the same work.
                "ConvTranspose" => input(1).map(|w| w[1..].iter().product()),
                "MatMul" | "Gemm" => input(0).and_then(|a| a.last().copied()),
                _ => None,
            };
            (produced.max(1) as u64).saturating_mul(reduction.unwrap_or(1).max(1) as u64)
        })
        .collect())
}

/// The estimated cost of a probe that switches `calibrations` (plan indices) on
/// the float model and wants `wanted`: the nodes downstream of them that the
/// wanted values depend on, as incremental execution re-runs them.
pub fn cone_cost(engine: &Engine, costs: &[u64], calibrations: &[usize], wanted: &[Slot]) -> u64 {
    let plan = engine.plan();
    let nodes = plan.nodes();
    let mut dirty_slot = vec![false; plan.num_values()];
    let mut dirty_node = vec![false; nodes.len()];
    let starts: Vec<usize> = calibrations
        .iter()
        .map(|&c| plan.calibrations()[c].node)
        .collect();
    for (i, node) in nodes.iter().enumerate() {
        if starts.contains(&i) || node.inputs.iter().flatten().any(|&s| dirty_slot[s]) {
            dirty_node[i] = true;
            for &o in &node.outputs {
                dirty_slot[o] = true;
            }
        }
    }
    let mut run = vec![false; nodes.len()];
    let mut stack: Vec<Slot> = wanted.to_vec();
    while let Some(s) = stack.pop() {
        if !dirty_slot[s] {
            continue;
        }
        if let Some(p) = plan.producer(s)
            && dirty_node[p]
            && !run[p]
        {
            run[p] = true;
            stack.extend(nodes[p].inputs.iter().flatten().copied());
        }
    }
    run.iter()
        .zip(costs)
        .filter(|(r, _)| **r)
        .map(|(_, c)| *c)
        .fold(0u64, u64::saturating_add)
}

/// What a part was computed from, and which part it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartInfo {
    pub shard: Shard,
    /// Candidates of the whole sweep (every shard's together).
    pub candidates: usize,
}

/// Where a result came from: digests of the model and of the samples used. The same
/// in every part of a sweep and in its unsharded result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// `sha256:` of the model file (of its protobuf encoding when it has no file).
    pub model_digest: String,
    /// `sha256:` over the `.npy` files of the samples used, input by input (over
    /// the samples written as `.npy` when they were given in memory).
    pub data_digest: String,
}

impl Provenance {
    /// Digests of the engine's model and of its first `samples` samples.
    pub fn of(engine: &Engine, samples: usize) -> Result<Provenance, EngineError> {
        let model = engine.model();
        let bytes = std::fs::read(model.file())
            .ok()
            .filter(|_| !model.file().is_empty())
            .unwrap_or_else(|| hmct_ir::model_to_bytes(model));
        let mut data = Sha256::new();
        for s in 0..samples {
            for bytes in engine.sample_npy_bytes(s)? {
                // Lengths first, so that no two different sample sets hash alike.
                data.update(&(bytes.len() as u64).to_le_bytes());
                data.update(&bytes);
            }
        }
        Ok(Provenance {
            model_digest: format!("sha256:{}", hex(&sha256(&bytes))),
            data_digest: format!("sha256:{}", hex(&data.finalize())),
        })
    }
}

/// A result that can be a shard's part: what [`check_sweep`] reads of it.
pub trait Part {
    /// The command that writes it.
    const COMMAND: &'static str;
    /// `(model digest, data digest)`.
    fn digests(&self) -> (&str, &str);
    /// The options that change the result, compared as JSON.
    fn options_json(&self) -> serde_json::Value;
    fn part(&self) -> Option<&PartInfo>;
    /// The candidate indices of its entries.
    fn indices(&self) -> Vec<usize>;
}

/// Checks that `parts` (label, part) are the shards `1..=N` of one sweep, each once
/// ([`check_parts`]), and that their entries cover every candidate exactly once.
pub fn check_sweep<T: Part>(parts: &[(String, T)]) -> Result<(), MergeError> {
    let headers: Vec<PartHeader<'_>> = parts
        .iter()
        .map(|(label, p)| {
            let (model_digest, data_digest) = p.digests();
            PartHeader {
                label,
                command: T::COMMAND,
                model_digest,
                data_digest,
                options: p.options_json(),
                part: p.part(),
            }
        })
        .collect();
    check_parts(&headers)?;
    let labels: Vec<&str> = parts.iter().map(|(l, _)| l.as_str()).collect();
    let indices: Vec<Vec<usize>> = parts.iter().map(|(_, p)| p.indices()).collect();
    let candidates = parts[0].1.part().map_or(0, |s| s.candidates);
    check_coverage(&labels, &indices, candidates)
}

/// A part as [`check_parts`] sees it: a label for messages (its file name), what it
/// was computed from, its options (compared as JSON) and its shard.
pub struct PartHeader<'a> {
    pub label: &'a str,
    pub command: &'a str,
    pub model_digest: &'a str,
    pub data_digest: &'a str,
    pub options: serde_json::Value,
    pub part: Option<&'a PartInfo>,
}

/// Why parts cannot be merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    #[error("no part given")]
    NoParts,
    #[error("{label}: not a shard's part (it has no \"shard\"; it is a whole result already)")]
    NotAPart { label: String },
    #[error("{a} and {b} come from different {what}: {a_value} vs {b_value}")]
    Mismatch {
        what: &'static str,
        a: String,
        b: String,
        a_value: String,
        b_value: String,
    },
    #[error("shard {shard} is given twice: {a} and {b}")]
    Duplicate { shard: Shard, a: String, b: String },
    #[error("missing shard(s) {} of {count}", .missing.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Missing { missing: Vec<usize>, count: usize },
    #[error("{label}: {message}")]
    Corrupt { label: String, message: String },
}

/// Checks that `parts` are the shards `1..=N` of one sweep: same command, model,
/// data, options, shard count and candidate count, each shard once.
pub fn check_parts(parts: &[PartHeader<'_>]) -> Result<(), MergeError> {
    let first = parts.first().ok_or(MergeError::NoParts)?;
    let mut infos: Vec<&PartInfo> = Vec::with_capacity(parts.len());
    for p in parts {
        match p.part {
            Some(info) => infos.push(info),
            None => {
                return Err(MergeError::NotAPart {
                    label: p.label.to_string(),
                });
            }
        }
    }
    let mismatch = |what, b: &str, a_value: String, b_value: String| MergeError::Mismatch {
        what,
        a: first.label.to_string(),
        b: b.to_string(),
        a_value,
        b_value,
    };
    for (p, info) in parts.iter().zip(&infos).skip(1) {
        let p_label = p.label;
        if p.command != first.command {
            return Err(mismatch(
                "commands",
                p_label,
                first.command.to_string(),
                p.command.to_string(),
            ));
        }
        if p.model_digest != first.model_digest {
            return Err(mismatch(
                "models",
                p_label,
                first.model_digest.to_string(),
                p.model_digest.to_string(),
            ));
        }
        if p.data_digest != first.data_digest {
            return Err(mismatch(
                "data",
                p_label,
                first.data_digest.to_string(),
                p.data_digest.to_string(),
            ));
        }
        if p.options != first.options {
            return Err(mismatch(
                "options",
                p_label,
                first.options.to_string(),
                p.options.to_string(),
            ));
        }
        if info.shard.count != infos[0].shard.count {
            return Err(mismatch(
                "shard counts",
                p_label,
                infos[0].shard.to_string(),
                info.shard.to_string(),
            ));
        }
        if info.candidates != infos[0].candidates {
            return Err(mismatch(
                "candidate lists",
                p_label,
                format!("{} candidates", infos[0].candidates),
                format!("{} candidates", info.candidates),
            ));
        }
    }
    let count = infos[0].shard.count;
    let mut seen: Vec<Option<&str>> = vec![None; count];
    for (p, info) in parts.iter().zip(&infos) {
        let shard = info.shard;
        if shard.index == 0 || shard.index > count {
            return Err(MergeError::Corrupt {
                label: p.label.to_string(),
                message: format!("shard {shard} is out of range"),
            });
        }
        if let Some(a) = seen[shard.index - 1] {
            return Err(MergeError::Duplicate {
                shard,
                a: a.to_string(),
                b: p.label.to_string(),
            });
        }
        seen[shard.index - 1] = Some(p.label);
    }
    let missing: Vec<usize> = (1..=count).filter(|i| seen[i - 1].is_none()).collect();
    if !missing.is_empty() {
        return Err(MergeError::Missing { missing, count });
    }
    Ok(())
}

/// Checks that the parts' candidate indices (`indices[part]`) cover `0..candidates`
/// exactly once.
pub fn check_coverage(
    labels: &[&str],
    indices: &[Vec<usize>],
    candidates: usize,
) -> Result<(), MergeError> {
    let mut owner: Vec<Option<usize>> = vec![None; candidates];
    for (p, list) in indices.iter().enumerate() {
        for &i in list {
            let corrupt = |message: String| MergeError::Corrupt {
                label: labels[p].to_string(),
                message,
            };
            match owner.get(i) {
                None => return Err(corrupt(format!("candidate index {i} is out of range"))),
                Some(Some(q)) => {
                    return Err(corrupt(format!("candidate {i} is also in {}", labels[*q])));
                }
                Some(None) => owner[i] = Some(p),
            }
        }
    }
    if let Some(i) = owner.iter().position(Option::is_none) {
        return Err(MergeError::Corrupt {
            label: labels[0].to_string(),
            message: format!("candidate {i} is in no part (parts of different versions?)"),
        });
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sha256_known_answers() {
        // FIPS 180-4 examples, and a length that crosses block boundaries.
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&sha256(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        // Fed in odd pieces, the same digest as in one go.
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut h = Sha256::new();
        for piece in data.chunks(37) {
            h.update(piece);
        }
        assert_eq!(<[u8; 32]>::from(h.finalize()), sha256(&data));
    }

    #[test]
    fn shard_syntax() {
        assert_eq!(
            "2/8".parse::<Shard>().unwrap(),
            Shard { index: 2, count: 8 }
        );
        assert_eq!(
            " 1 / 1 ".parse::<Shard>().unwrap(),
            Shard { index: 1, count: 1 }
        );
        for bad in ["0/3", "4/3", "3", "a/3", "1/0", "-1/3", "1/3/4", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }

    #[test]
    fn partition_balances_by_cost() {
        // One big item alone, the small ones together.
        assert_eq!(partition(&[1, 10, 1, 1], 2), vec![1, 0, 1, 1]);
        // More shards than items: the extra shards stay empty.
        assert_eq!(partition(&[5, 5], 3), vec![0, 1]);
        // Equal candidates share a shard.
        assert_eq!(
            partition_groups(&["a", "b", "a"], &[4, 4, 4], 2),
            vec![0, 1, 0]
        );
    }

    proptest! {
        /// Any costs, any shard count: every item in exactly one shard, the same
        /// split when computed again, and no shard above the mean by more than the
        /// largest item (the greedy bound).
        #[test]
        fn partition_covers_every_item_once(
            costs in proptest::collection::vec(0u64..1_000_000, 0..300),
            count in 1usize..40,
        ) {
            let shards = partition(&costs, count);
            prop_assert_eq!(shards.len(), costs.len());
            prop_assert!(shards.iter().all(|&s| s < count));
            prop_assert_eq!(&shards, &partition(&costs, count));
            let mut load = vec![0u64; count];
            for (i, &s) in shards.iter().enumerate() {
                load[s] += costs[i].max(1);
            }
            let total: u64 = load.iter().sum();
            let biggest = costs.iter().map(|c| (*c).max(1)).max().unwrap_or(0);
            let max_load = load.iter().copied().max().unwrap_or(0);
            prop_assert!(max_load as f64 <= total as f64 / count as f64 + biggest as f64);
        }
    }
}
