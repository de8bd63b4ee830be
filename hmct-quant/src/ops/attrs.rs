//! Typed access to a node's ONNX attributes.

use hmct_proto::onnx::{AttributeProto, attribute_proto::AttributeType};
use hmct_tensor::{Tensor, tensor_from_proto};

use super::OpError;

/// The attributes of one node, looked up by name.
#[derive(Clone, Copy)]
pub struct Attrs<'a> {
    list: &'a [AttributeProto],
}

impl<'a> Attrs<'a> {
    pub fn new(list: &'a [AttributeProto]) -> Self {
        Attrs { list }
    }

    /// The raw attribute, if present.
    pub fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        self.list.iter().find(|a| a.name() == name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Names of all attributes (for reporting unknown ones).
    pub fn names(&self) -> impl Iterator<Item = &'a str> {
        self.list.iter().map(|a| a.name())
    }

    fn typed(
        &self,
        name: &str,
        want: AttributeType,
    ) -> Result<Option<&'a AttributeProto>, OpError> {
        match self.get(name) {
            None => Ok(None),
            Some(a) => {
                // Files from old exporters omit `type`; trust the populated field then.
                if a.r#type.is_some() && a.r#type() != want {
                    Err(OpError::invalid(format!(
                        "attribute '{name}' has type {:?}, expected {:?}",
                        a.r#type(),
                        want
                    )))
                } else {
                    Ok(Some(a))
                }
            }
        }
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>, OpError> {
        Ok(self.typed(name, AttributeType::Int)?.map(|a| a.i()))
    }

    pub fn int_or(&self, name: &str, default: i64) -> Result<i64, OpError> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    pub fn float(&self, name: &str) -> Result<Option<f32>, OpError> {
        Ok(self.typed(name, AttributeType::Float)?.map(|a| a.f()))
    }

    pub fn float_or(&self, name: &str, default: f32) -> Result<f32, OpError> {
        Ok(self.float(name)?.unwrap_or(default))
    }

    pub fn string(&self, name: &str) -> Result<Option<String>, OpError> {
        Ok(self
            .typed(name, AttributeType::String)?
            .map(|a| String::from_utf8_lossy(a.s()).into_owned()))
    }

    pub fn string_or(&self, name: &str, default: &str) -> Result<String, OpError> {
        Ok(self.string(name)?.unwrap_or_else(|| default.to_string()))
    }

    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, OpError> {
        Ok(self
            .typed(name, AttributeType::Ints)?
            .map(|a| a.ints.clone()))
    }

    pub fn floats(&self, name: &str) -> Result<Option<Vec<f32>>, OpError> {
        Ok(self
            .typed(name, AttributeType::Floats)?
            .map(|a| a.floats.clone()))
    }

    pub fn strings(&self, name: &str) -> Result<Option<Vec<String>>, OpError> {
        Ok(self.typed(name, AttributeType::Strings)?.map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        }))
    }

    pub fn tensor(&self, name: &str) -> Result<Option<Tensor>, OpError> {
        match self.typed(name, AttributeType::Tensor)? {
            None => Ok(None),
            Some(a) => {
                let t = a.t.as_ref().ok_or_else(|| {
                    OpError::invalid(format!("attribute '{name}' holds no tensor"))
                })?;
                tensor_from_proto(t, None)
                    .map(Some)
                    .map_err(|e| OpError::invalid(format!("attribute '{name}': {e}")))
            }
        }
    }

    /// The graph of a subgraph attribute (`If` branches).
    pub fn graph(&self, name: &str) -> Result<Option<&'a hmct_proto::onnx::GraphProto>, OpError> {
        Ok(self
            .typed(name, AttributeType::Graph)?
            .and_then(|a| a.g.as_ref()))
    }
}
