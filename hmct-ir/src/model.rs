//! [`Model`]: an ONNX model with a validated, indexed main graph.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use hmct_proto::Message;
use hmct_proto::onnx::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, ValueInfoProto,
    tensor_shape_proto::dimension, type_proto,
};
use hmct_tensor::{DType, Tensor};

use crate::IrError;

/// Index of a node in `model.proto().graph.node`. Stable under attribute edits.
pub type NodeId = usize;

/// The label used in errors for models that do not come from a file.
const MEMORY: &str = "<memory>";

/// An ONNX model whose main graph is known to be well formed: every node has a
/// unique, non-empty name, nodes are in topological order, every node input is
/// produced exactly once (by a node, an initializer or a graph input).
///
/// The protobuf message is kept as loaded, so everything this crate does not
/// interpret (metadata, doc strings, value_info, unknown attributes, functions)
/// survives a save. Structural edits go through [`Model::into_proto`] and
/// [`Model::from_proto`], which validates and re-indexes.
#[derive(Clone)]
pub struct Model {
    proto: ModelProto,
    file: String,
    base_dir: Option<PathBuf>,
    index: Index,
    /// Set by the loader when the file was a QDQ model (see `qdq_import`).
    pub(crate) qdq: Option<crate::QdqImport>,
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("file", &self.file)
            .field("nodes", &self.nodes().len())
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Default)]
struct Index {
    names: HashMap<String, NodeId>,
    types: BTreeMap<String, Vec<NodeId>>,
    producers: HashMap<String, NodeId>,
    consumers: HashMap<String, Vec<NodeId>>,
    initializers: HashMap<String, usize>,
    inputs: Vec<String>,
    outputs: Vec<String>,
}

/// Reads and validates a model file. See [`Model`] for what loading guarantees; the
/// only changes made to the message are names for unnamed (or duplicate-named) nodes
/// and a topological re-ordering of the nodes when the file is not ordered.
pub fn load_model(path: impl AsRef<Path>) -> Result<Model, IrError> {
    let path = path.as_ref();
    let file = path.display().to_string();
    if path.is_dir() {
        // Most often the data folder given where the model goes.
        return Err(IrError::NotOnnx {
            file,
            message: "a folder; a .onnx model file was expected (the model comes first, then the data folder)".into(),
        });
    }
    let bytes = std::fs::read(path).map_err(|error| IrError::Io {
        file: file.clone(),
        error,
    })?;
    let base_dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    decode(&bytes, file, Some(base_dir))
}

/// Reads a model from bytes. External data cannot be resolved (no folder).
pub fn load_model_from_bytes(bytes: &[u8]) -> Result<Model, IrError> {
    decode(bytes, MEMORY.to_string(), None)
}

fn decode(bytes: &[u8], file: String, base_dir: Option<PathBuf>) -> Result<Model, IrError> {
    let proto = ModelProto::decode(bytes).map_err(|error| IrError::Decode {
        file: file.clone(),
        error,
    })?;
    // Protobuf accepts many byte strings (even an empty one) as a message; these
    // checks tell an ONNX model from other data and from a file cut at a field end.
    let not_onnx = |message: &str| IrError::NotOnnx {
        file: file.clone(),
        message: message.to_string(),
    };
    let ir_version = proto.ir_version.ok_or_else(|| not_onnx("no ir_version"))?;
    if proto.graph.is_none() {
        return Err(not_onnx("no graph"));
    }
    if ir_version >= 3 && proto.opset_import.is_empty() {
        return Err(not_onnx("no opset_import"));
    }
    let model = Model::build(proto, file, base_dir)?;
    crate::qdq_import::import_on_load(model)
}

/// The bytes of the model as it would be saved: the message as held, plus the
/// `horizon` opset import (version 1) when the model has calibration nodes and does
/// not declare it.
pub fn model_to_bytes(model: &Model) -> Vec<u8> {
    if model.needs_horizon_opset() {
        let mut proto = model.proto.clone();
        proto.opset_import.push(OperatorSetIdProto {
            domain: Some(crate::calibration::CALIBRATION_DOMAIN.to_string()),
            version: Some(1),
        });
        proto.encode_to_vec()
    } else {
        model.proto.encode_to_vec()
    }
}

/// Writes the model atomically: the bytes go to a temporary file in the target's
/// folder, which is then renamed over the target, so a failure never leaves a
/// half-written model behind.
///
/// External data (ONNX's way to store weights outside the message): a model saved
/// into the folder it was read from keeps its data files as they are. Saved into
/// another folder, or too big for one protobuf message (2 GiB), its external tensors
/// and large initializers go to `<file name>.data` beside it, written first, also
/// through a temporary file.
pub fn save_model(model: &Model, path: impl AsRef<Path>) -> Result<(), IrError> {
    let path = path.as_ref();
    // The horizon opset import adds a few bytes: nothing against the 2 GiB limit.
    if !crate::external::needs_data_file(&model.proto, model.base_dir(), path) {
        return write_atomic(path, &model_to_bytes(model));
    }
    save_with_data_file(model, path, crate::external::EXTERNAL_MIN_BYTES)
}

/// Saves `model` at `path` with its external tensors and every initializer of at
/// least `min_bytes` in `<file name>.data` beside it (the data file is written
/// first). Returns the data file's path.
pub fn save_model_with_external_data(
    model: &Model,
    path: impl AsRef<Path>,
    min_bytes: usize,
) -> Result<PathBuf, IrError> {
    let path = path.as_ref();
    save_with_data_file(model, path, min_bytes)?;
    Ok(crate::external::data_file_path(path))
}

fn save_with_data_file(model: &Model, path: &Path, min_bytes: usize) -> Result<(), IrError> {
    let mut proto = model.proto.clone();
    if model.needs_horizon_opset() {
        proto.opset_import.push(OperatorSetIdProto {
            domain: Some(crate::calibration::CALIBRATION_DOMAIN.to_string()),
            version: Some(1),
        });
    }
    crate::external::write_data_file(&mut proto, model.base_dir(), path, min_bytes)?;
    write_atomic(path, &proto.encode_to_vec())
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
///
/// A target that exists and is not a regular file (`/dev/null`, `/dev/stdout`, a
/// FIFO) is written in place: renaming over it would replace the device or pipe with
/// a regular file (and, as root, even succeed in `/dev`). A symbolic link is followed,
/// so the link stays and the file it points to gets the bytes.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), IrError> {
    let io = |error| IrError::Io {
        file: path.display().to_string(),
        error,
    };
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() && !m.is_dir() => {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io)?;
            return f.write_all(bytes).and_then(|()| f.flush()).map_err(io);
        }
        _ => {}
    }
    let resolved;
    let path = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            // A dangling link cannot be resolved; replacing it is then the best guess.
            resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
            resolved.as_path()
        }
        _ => path,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".hmct-save-")
        .tempfile_in(dir)
        .map_err(|e| io(without_temp_name(e)))?;
    tmp.write_all(bytes).map_err(io)?;
    // Temporary files are created private (0600); the result should look like any
    // other file the user writes, or keep the mode of the file it replaces.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let perms = std::fs::metadata(path)
            .map(|m| m.permissions())
            .unwrap_or_else(|_| std::fs::Permissions::from_mode(0o644));
        tmp.as_file().set_permissions(perms).map_err(io)?;
    }
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// tempfile's errors end with the random name of the file it tried to create
/// (` at path "..."`), which the user never asked for; the caller names the target.
fn without_temp_name(e: std::io::Error) -> std::io::Error {
    let text = e.to_string();
    match text.rfind(" at path \"") {
        Some(i) => std::io::Error::new(e.kind(), &text[..i]),
        None => e,
    }
}

impl Model {
    /// Validates and indexes a message built or edited in code. `base_dir` is the
    /// folder external data is read from.
    pub fn from_proto(proto: ModelProto, base_dir: Option<PathBuf>) -> Result<Model, IrError> {
        Model::build(proto, MEMORY.to_string(), base_dir)
    }

    pub(crate) fn build(
        mut proto: ModelProto,
        file: String,
        base_dir: Option<PathBuf>,
    ) -> Result<Model, IrError> {
        let graph = proto.graph.get_or_insert_with(GraphProto::default);
        name_nodes(&mut graph.node);
        let producers = check_values(graph, &file)?;
        sort_nodes(graph, &producers, &file)?;
        let index = Index::new(graph);
        Ok(Model {
            proto,
            file,
            base_dir,
            index,
            qdq: None,
        })
    }

    /// The protobuf message.
    pub fn proto(&self) -> &ModelProto {
        &self.proto
    }

    /// The protobuf message, for structural edits (re-validate with
    /// [`Model::from_proto`]).
    pub fn into_proto(self) -> ModelProto {
        self.proto
    }

    /// The main graph.
    pub fn graph_proto(&self) -> &GraphProto {
        self.proto
            .graph
            .as_ref()
            .expect("a Model always has a graph")
    }

    /// The file the model was loaded from, or `<memory>`; used in error messages.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The folder of the model file (where external data lives).
    pub fn base_dir(&self) -> Option<&Path> {
        self.base_dir.as_deref()
    }

    /// The imported opset version of `domain`; `""` and `"ai.onnx"` are the same.
    pub fn opset(&self, domain: &str) -> Option<i64> {
        let norm = |d: &str| if d == "ai.onnx" { "" } else { d }.to_string();
        let want = norm(domain);
        self.proto
            .opset_import
            .iter()
            .find(|o| norm(o.domain()) == want)
            .map(|o| o.version())
    }

    /// All nodes, in topological order; a [`NodeId`] indexes this slice.
    pub fn nodes(&self) -> &[NodeProto] {
        &self.graph_proto().node
    }

    /// The node with id `id`. Panics if `id` is out of range, like slice indexing.
    pub fn node(&self, id: NodeId) -> &NodeProto {
        &self.nodes()[id]
    }

    /// The (unique, non-empty) name of node `id`.
    pub fn node_name(&self, id: NodeId) -> &str {
        self.node(id).name()
    }

    /// The id of the node called `name`, or an error naming the model and the name.
    pub fn node_id(&self, name: &str) -> Result<NodeId, IrError> {
        self.index
            .names
            .get(name)
            .copied()
            .ok_or_else(|| IrError::UnknownNode {
                file: self.file.clone(),
                name: name.to_string(),
            })
    }

    /// Node name → id, for every node.
    pub fn node_mappings(&self) -> &HashMap<String, NodeId> {
        &self.index.names
    }

    /// op_type → ids of the nodes of that type, in graph order.
    pub fn type2nodes(&self) -> &BTreeMap<String, Vec<NodeId>> {
        &self.index.types
    }

    /// Ids of the nodes of type `op_type`, in graph order.
    pub fn nodes_of_type(&self, op_type: &str) -> &[NodeId] {
        self.index
            .types
            .get(op_type)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The node that outputs `value` (None for graph inputs, initializers, unknown names).
    pub fn producer(&self, value: &str) -> Option<NodeId> {
        self.index.producers.get(value).copied()
    }

    /// The nodes that read `value`, in graph order, each once. A node whose subgraph
    /// (If/Loop/Scan body) reads `value` from the outer scope counts as a reader.
    pub fn consumers(&self, value: &str) -> &[NodeId] {
        self.index
            .consumers
            .get(value)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Names of the graph inputs that are not initializers (the data the user feeds).
    pub fn inputs(&self) -> &[String] {
        &self.index.inputs
    }

    /// Names of the graph outputs.
    pub fn outputs(&self) -> &[String] {
        &self.index.outputs
    }

    /// True when `value` is a graph output.
    pub fn is_graph_output(&self, value: &str) -> bool {
        self.index.outputs.iter().any(|o| o == value)
    }

    /// The initializer called `name`.
    pub fn initializer(&self, name: &str) -> Option<&TensorProto> {
        self.index
            .initializers
            .get(name)
            .map(|&i| &self.graph_proto().initializer[i])
    }

    /// True when `value` is an initializer or the output of a `Constant` node.
    pub fn is_constant(&self, value: &str) -> bool {
        self.index.initializers.contains_key(value)
            || self
                .producer(value)
                .is_some_and(|id| is_constant_node(self.node(id)))
    }

    /// The value of an initializer or `Constant` node output (None for any other
    /// value). External data is read from [`Model::base_dir`].
    pub fn constant_tensor(&self, value: &str) -> Result<Option<Tensor>, IrError> {
        if let Some(t) = self.initializer(value) {
            return crate::constant::tensor_from_proto(t, self.base_dir())
                .map(Some)
                .map_err(|error| IrError::Tensor {
                    file: self.file.clone(),
                    value: value.to_string(),
                    error,
                });
        }
        match self.producer(value) {
            Some(id) if is_constant_node(self.node(id)) => {
                crate::constant::constant_node_value(self, id).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Type and shape of a graph input, graph output or `value_info` entry.
    pub fn value_type(&self, name: &str) -> Option<ValueType> {
        let g = self.graph_proto();
        g.input
            .iter()
            .chain(&g.output)
            .chain(&g.value_info)
            .find(|v| v.name() == name)
            .and_then(ValueType::from_value_info)
    }

    fn needs_horizon_opset(&self) -> bool {
        !self.calibration_nodes().is_empty()
            && self.opset(crate::calibration::CALIBRATION_DOMAIN).is_none()
    }

    /// Mutable access to one node for attribute edits (structure must not change).
    pub(crate) fn node_mut(&mut self, id: NodeId) -> &mut NodeProto {
        &mut self
            .proto
            .graph
            .as_mut()
            .expect("a Model always has a graph")
            .node[id]
    }
}

fn is_constant_node(n: &NodeProto) -> bool {
    n.op_type() == "Constant" && matches!(n.domain(), "" | "ai.onnx")
}

/// One dimension of a declared shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    Fixed(i64),
    Symbolic(String),
    Unknown,
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(d) => write!(f, "{d}"),
            Dim::Symbolic(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// The declared element type and shape of a tensor value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueType {
    /// ONNX `TensorProto.DataType` code (see [`DType::onnx_code_name`]).
    pub elem_type: i32,
    /// `None` when the rank is not declared.
    pub shape: Option<Vec<Dim>>,
}

impl ValueType {
    /// The type of a tensor `ValueInfoProto` (None for sequences, maps, missing types).
    pub fn from_value_info(v: &ValueInfoProto) -> Option<ValueType> {
        let Some(type_proto::Value::TensorType(t)) = v.r#type.as_ref()?.value.as_ref() else {
            return None;
        };
        let shape = t.shape.as_ref().map(|s| {
            s.dim
                .iter()
                .map(|d| match &d.value {
                    Some(dimension::Value::DimValue(v)) => Dim::Fixed(*v),
                    Some(dimension::Value::DimParam(p)) if !p.is_empty() => {
                        Dim::Symbolic(p.clone())
                    }
                    _ => Dim::Unknown,
                })
                .collect()
        });
        Some(ValueType {
            elem_type: t.elem_type(),
            shape,
        })
    }

    /// The element type, if this crate's tensors support it.
    pub fn dtype(&self) -> Option<DType> {
        DType::from_onnx(self.elem_type)
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&DType::onnx_code_name(self.elem_type))?;
        match &self.shape {
            Some(dims) => {
                let dims: Vec<String> = dims.iter().map(Dim::to_string).collect();
                write!(f, "[{}]", dims.join(", "))
            }
            None => f.write_str("[?]"),
        }
    }
}

/// Gives unnamed nodes the name `<op_type>_<n>` (n: the node's position, raised
/// until the name is free) and renames later nodes that repeat an earlier name to
/// `<name>_<k>`, so names can key node lookups.
fn name_nodes(nodes: &mut [NodeProto]) {
    let mut taken: HashSet<String> = nodes
        .iter()
        .map(|n| n.name().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    let mut seen: HashSet<String> = HashSet::new();
    for (i, node) in nodes.iter_mut().enumerate() {
        let name = node.name().to_string();
        if !name.is_empty() && seen.insert(name.clone()) {
            continue;
        }
        let new = if name.is_empty() {
            let op = if node.op_type().is_empty() {
                "node"
            } else {
                node.op_type()
            };
            (i..)
                .map(|n| format!("{op}_{n}"))
                .find(|c| !taken.contains(c))
        } else {
            (1..)
                .map(|k| format!("{name}_{k}"))
                .find(|c| !taken.contains(c))
        }
        .expect("an unbounded range always has a free name");
        taken.insert(new.clone());
        seen.insert(new.clone());
        node.name = Some(new);
    }
}

/// Checks that every value is defined once and every input and graph output is
/// defined; returns value → index of the producing node (file order).
fn check_values(graph: &GraphProto, file: &str) -> Result<HashMap<String, usize>, IrError> {
    let mut outer: HashSet<&str> = graph.input.iter().map(|v| v.name()).collect();
    outer.extend(graph.initializer.iter().map(|t| t.name()));
    outer.extend(
        graph
            .sparse_initializer
            .iter()
            .filter_map(|s| s.values.as_ref().map(|v| v.name())),
    );
    let mut producers: HashMap<String, usize> = HashMap::new();
    for (i, node) in graph.node.iter().enumerate() {
        for out in node.output.iter().filter(|o| !o.is_empty()) {
            let earlier = if outer.contains(out.as_str()) {
                Some("a graph input or initializer".to_string())
            } else {
                producers
                    .get(out)
                    .map(|&j| format!("node '{}'", graph.node[j].name()))
            };
            if let Some(earlier) = earlier {
                return Err(IrError::DuplicateOutput {
                    file: file.to_string(),
                    value: out.clone(),
                    producers: vec![earlier, format!("node '{}'", node.name())],
                });
            }
            producers.insert(out.clone(), i);
        }
    }
    let defined = |v: &str| outer.contains(v) || producers.contains_key(v);
    for node in &graph.node {
        if let Some(v) = node.input.iter().find(|v| !v.is_empty() && !defined(v)) {
            return Err(IrError::DanglingInput {
                file: file.to_string(),
                node: node.name().to_string(),
                value: v.clone(),
            });
        }
    }
    if let Some(v) = graph.output.iter().find(|v| !defined(v.name())) {
        return Err(IrError::DanglingOutput {
            file: file.to_string(),
            value: v.name().to_string(),
        });
    }
    Ok(producers)
}

/// Every value a node reads: its inputs and what its subgraphs read from outside.
fn node_reads(node: &NodeProto) -> Vec<&str> {
    let mut reads: Vec<&str> = node
        .input
        .iter()
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .collect();
    for a in &node.attribute {
        for g in a.g.iter().chain(&a.graphs) {
            outer_reads(g, &mut reads);
        }
    }
    reads
}

/// Names a subgraph reads from enclosing scopes (used but not defined inside it).
fn outer_reads<'g>(g: &'g GraphProto, reads: &mut Vec<&'g str>) {
    let mut local: HashSet<&str> = g.input.iter().map(|v| v.name()).collect();
    local.extend(g.initializer.iter().map(|t| t.name()));
    local.extend(
        g.node
            .iter()
            .flat_map(|n| n.output.iter().map(String::as_str)),
    );
    let mut inner = Vec::new();
    for n in &g.node {
        inner.extend(n.input.iter().map(String::as_str));
        for a in &n.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                outer_reads(sub, &mut inner);
            }
        }
    }
    inner.extend(g.output.iter().map(|v| v.name()));
    reads.extend(
        inner
            .into_iter()
            .filter(|v| !v.is_empty() && !local.contains(v)),
    );
}

/// Puts the nodes in topological order, keeping the file order where it already is
/// one (Kahn's algorithm, always taking the earliest ready node).
fn sort_nodes(
    graph: &mut GraphProto,
    producers: &HashMap<String, usize>,
    file: &str,
) -> Result<(), IrError> {
    let n = graph.node.len();
    let deps: Vec<Vec<usize>> = graph
        .node
        .iter()
        .map(|node| {
            let mut d: Vec<usize> = node_reads(node)
                .into_iter()
                .filter_map(|v| producers.get(v).copied())
                .collect();
            d.sort_unstable();
            d.dedup();
            d
        })
        .collect();
    if deps
        .iter()
        .enumerate()
        .all(|(i, d)| d.iter().all(|&j| j < i))
    {
        return Ok(());
    }
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut pending: Vec<usize> = vec![0; n];
    for (i, d) in deps.iter().enumerate() {
        pending[i] = d.len();
        for &j in d {
            users[j].push(i);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&i| pending[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for &u in &users[i] {
            pending[u] -= 1;
            if pending[u] == 0 {
                ready.push(Reverse(u));
            }
        }
    }
    if order.len() < n {
        return Err(IrError::Cycle {
            file: file.to_string(),
            nodes: find_cycle(&deps, &pending)
                .into_iter()
                .map(|i| graph.node[i].name().to_string())
                .collect(),
        });
    }
    let mut old: Vec<Option<NodeProto>> = std::mem::take(&mut graph.node)
        .into_iter()
        .map(Some)
        .collect();
    graph.node = order
        .into_iter()
        .map(|i| old[i].take().expect("each node is placed once"))
        .collect();
    Ok(())
}

/// A cycle among the nodes Kahn's algorithm could not place: each of them still
/// waits on an unplaced dependency, so walking those dependencies must repeat.
fn find_cycle(deps: &[Vec<usize>], pending: &[usize]) -> Vec<usize> {
    let stuck = |i: usize| pending[i] > 0;
    let Some(start) = (0..deps.len()).find(|&i| stuck(i)) else {
        return Vec::new();
    };
    let mut path = vec![start];
    let mut pos: HashMap<usize, usize> = HashMap::from([(start, 0)]);
    let mut cur = start;
    loop {
        let Some(&next) = deps[cur].iter().find(|&&j| stuck(j)) else {
            return path;
        };
        if let Some(&p) = pos.get(&next) {
            let mut cycle = path[p..].to_vec();
            // Walked against the data flow; report the nodes in flow order.
            cycle.reverse();
            return cycle;
        }
        pos.insert(next, path.len());
        path.push(next);
        cur = next;
    }
}

impl Index {
    fn new(graph: &GraphProto) -> Index {
        let mut ix = Index::default();
        for (i, t) in graph.initializer.iter().enumerate() {
            ix.initializers.entry(t.name().to_string()).or_insert(i);
        }
        for (id, node) in graph.node.iter().enumerate() {
            ix.names.insert(node.name().to_string(), id);
            ix.types
                .entry(node.op_type().to_string())
                .or_default()
                .push(id);
            for out in node.output.iter().filter(|o| !o.is_empty()) {
                ix.producers.insert(out.clone(), id);
            }
            for v in node_reads(node) {
                let c = ix.consumers.entry(v.to_string()).or_default();
                // Ids arrive in increasing order, so a repeat read is always the last.
                if c.last() != Some(&id) {
                    c.push(id);
                }
            }
        }
        ix.inputs = graph
            .input
            .iter()
            .map(|v| v.name().to_string())
            .filter(|v| !ix.initializers.contains_key(v))
            .collect();
        ix.outputs = graph.output.iter().map(|v| v.name().to_string()).collect();
        ix
    }
}
