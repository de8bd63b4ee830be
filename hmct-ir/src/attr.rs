//! Reading and writing node attributes: the one set of helpers the calibration views,
//! the QDQ import and export and the opset raise share.

use hmct_proto::onnx::{AttributeProto, NodeProto, attribute_proto::AttributeType};

pub(crate) fn get<'n>(node: &'n NodeProto, name: &str) -> Option<&'n AttributeProto> {
    node.attribute.iter().find(|a| a.name() == name)
}

pub(crate) fn get_int(node: &NodeProto, name: &str) -> Option<i64> {
    get(node, name).and_then(|a| a.i)
}

/// Float list, accepting a single `f` as a one-element list. None when absent.
pub(crate) fn get_floats(node: &NodeProto, name: &str) -> Option<Vec<f32>> {
    let a = get(node, name)?;
    Some(match (a.floats.is_empty(), a.f) {
        (true, Some(f)) => vec![f],
        _ => a.floats.clone(),
    })
}

/// Int list, accepting a single `i` as a one-element list. None when absent.
pub(crate) fn get_ints(node: &NodeProto, name: &str) -> Option<Vec<i64>> {
    let a = get(node, name)?;
    Some(match (a.ints.is_empty(), a.i) {
        (true, Some(i)) => vec![i],
        _ => a.ints.clone(),
    })
}

/// A string attribute's value(s): `s` and `strings` alike.
pub(crate) fn get_strings(node: &NodeProto, name: &str) -> Vec<String> {
    let Some(a) = get(node, name) else {
        return Vec::new();
    };
    a.s.iter()
        .chain(&a.strings)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect()
}

/// Replaces the attribute of the same name in place (keeping its position and doc
/// string), or appends it.
pub(crate) fn set(node: &mut NodeProto, mut new: AttributeProto) {
    match node.attribute.iter_mut().find(|a| a.name == new.name) {
        Some(old) => {
            new.doc_string = old.doc_string.take();
            *old = new;
        }
        None => node.attribute.push(new),
    }
}

/// Removes the attribute `name` and returns it.
pub(crate) fn take(node: &mut NodeProto, name: &str) -> Option<AttributeProto> {
    let i = node.attribute.iter().position(|a| a.name() == name)?;
    Some(node.attribute.remove(i))
}

fn base(name: &str, ty: AttributeType) -> AttributeProto {
    AttributeProto {
        name: Some(name.to_string()),
        r#type: Some(ty as i32),
        ..Default::default()
    }
}

pub fn string(name: &str, value: &str) -> AttributeProto {
    AttributeProto {
        s: Some(value.as_bytes().to_vec()),
        ..base(name, AttributeType::String)
    }
}

pub fn float(name: &str, value: f32) -> AttributeProto {
    AttributeProto {
        f: Some(value),
        ..base(name, AttributeType::Float)
    }
}

pub fn floats(name: &str, values: Vec<f32>) -> AttributeProto {
    AttributeProto {
        floats: values,
        ..base(name, AttributeType::Floats)
    }
}

pub fn ints(name: &str, values: Vec<i64>) -> AttributeProto {
    AttributeProto {
        ints: values,
        ..base(name, AttributeType::Ints)
    }
}

pub fn int(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        i: Some(value),
        ..base(name, AttributeType::Int)
    }
}
