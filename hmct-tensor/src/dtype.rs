use std::fmt;

/// Element types, numbered as ONNX's `TensorProto.DataType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32 = 1,
    U8 = 2,
    I8 = 3,
    U16 = 4,
    I16 = 5,
    I32 = 6,
    I64 = 7,
    String = 8,
    Bool = 9,
    F16 = 10,
    F64 = 11,
    U32 = 12,
    U64 = 13,
    BF16 = 16,
}

impl DType {
    /// All supported element types.
    pub const ALL: [DType; 14] = [
        DType::F32,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::String,
        DType::Bool,
        DType::F16,
        DType::F64,
        DType::U32,
        DType::U64,
        DType::BF16,
    ];

    /// The type for an ONNX `TensorProto.DataType` code, if supported.
    pub fn from_onnx(code: i32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| *d as i32 == code)
    }

    /// The ONNX `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        self as i32
    }

    /// The ONNX name of an element type code (`float`, `int64`, ... or `type <n>`),
    /// for error messages about codes this crate does not support.
    pub fn onnx_code_name(code: i32) -> String {
        match DType::from_onnx(code) {
            Some(d) => d.name().to_string(),
            None => match code {
                0 => "undefined".into(),
                14 => "complex64".into(),
                15 => "complex128".into(),
                17 => "float8e4m3fn".into(),
                18 => "float8e4m3fnuz".into(),
                19 => "float8e5m2".into(),
                20 => "float8e5m2fnuz".into(),
                21 => "uint4".into(),
                22 => "int4".into(),
                23 => "float4e2m1".into(),
                other => format!("type {other}"),
            },
        }
    }

    /// ONNX spelling of the type (`float`, `int8`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::U16 => "uint16",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::String => "string",
            DType::Bool => "bool",
            DType::F16 => "float16",
            DType::F64 => "double",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::BF16 => "bfloat16",
        }
    }

    /// Bytes per element (None for strings).
    pub fn size_of(self) -> Option<usize> {
        Some(match self {
            DType::U8 | DType::I8 | DType::Bool => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::String => return None,
        })
    }

    /// True for floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
