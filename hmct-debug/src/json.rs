//! The analyses' JSON files: numbers JSON cannot spell written as Python spells them
//! (`"inf"`, `"-inf"`, `"nan"`) and read back, and the pretty text every file is
//! written as.

use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A finite value as a JSON number, the others as strings.
pub fn number<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    let v = *v;
    if v.is_finite() {
        s.serialize_f64(v)
    } else if v.is_nan() {
        s.serialize_str("nan")
    } else if v > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_str("-inf")
    }
}

/// [`number`], or `null` for `None`.
pub fn opt_number<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => number(v, s),
        None => s.serialize_none(),
    }
}

/// A list of [`number`]s.
pub fn numbers<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for x in v {
        seq.serialize_element(&Number(*x))?;
    }
    seq.end()
}

/// [`numbers`], or `null` for `None`.
pub fn opt_numbers<S: Serializer>(v: &Option<Vec<f64>>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => numbers(v, s),
        None => s.serialize_none(),
    }
}

/// A number as [`number`] writes it, read back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Number(pub f64);

impl Serialize for Number {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        number(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Number(f64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Number(v) => Ok(Number(v)),
            Repr::Text(t) => match t.as_str() {
                "nan" => Ok(Number(f64::NAN)),
                "inf" => Ok(Number(f64::INFINITY)),
                "-inf" => Ok(Number(f64::NEG_INFINITY)),
                _ => Err(serde::de::Error::custom(format!(
                    "'{t}' is not a number (nor nan, inf, -inf)"
                ))),
            },
        }
    }
}

pub fn de_number<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Number::deserialize(d).map(|n| n.0)
}

pub fn de_opt_number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Ok(Option::<Number>::deserialize(d)?.map(|n| n.0))
}

pub fn de_numbers<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Ok(Vec::<Number>::deserialize(d)?
        .into_iter()
        .map(|n| n.0)
        .collect())
}

pub fn de_opt_numbers<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<f64>>, D::Error> {
    Ok(Option::<Vec<Number>>::deserialize(d)?.map(|v| v.into_iter().map(|n| n.0).collect()))
}

/// Pretty JSON with a final newline: the text of every JSON file the analyses write.
pub fn pretty<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    Ok(bytes)
}
