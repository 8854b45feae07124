//! Writing a structured input back into the bytes `Arbitrary` decodes it from, so that seeds can be
//! written as values and checked to round-trip.
//!
//! The crate-internal `structured!` declares a struct or enum that derives `Arbitrary` together
//! with its [`Encode`] impl, so the two cannot drift apart. The encoding follows arbitrary 1.x: integers
//! little-endian, `bool` one byte, `Option` a bool then the value, a `Vec` each element after a
//! `true` and then a `false` (also as the last field, which `arbitrary_take_rest` decodes the same
//! way), arrays element by element, struct fields in order, and an enum a u32 tag then the
//! variant's fields (see [`tag`]).

/// Writes a value as the bytes `Arbitrary` decodes back into it.
pub trait Encode {
    /// Appends the encoding to `out`.
    fn encode(&self, out: &mut Vec<u8>);

    /// The encoding alone.
    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

/// Decodes `bytes` as libfuzzer-sys does before calling a target (the inverse of [`Encode`]).
pub fn decode<'a, T: arbitrary::Arbitrary<'a>>(bytes: &'a [u8]) -> arbitrary::Result<T> {
    T::arbitrary_take_rest(arbitrary::Unstructured::new(bytes))
}

/// The tag of variant `k` of an `n`-variant enum: the derive maps a u32 `x` to
/// `(x * n) >> 32`, so the smallest `x` with that result is `ceil(k * 2^32 / n)`.
pub fn tag(out: &mut Vec<u8>, k: u64, n: u64) {
    let x = (k << 32).div_ceil(n);
    u32::try_from(x).unwrap_or(u32::MAX).encode(out);
}

macro_rules! encode_ints {
    ($($t:ty),*) => {$(
        impl Encode for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
encode_ints!(u8, u16, u32, u64);

impl Encode for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        u8::from(*self).encode(out);
    }
}

impl<T: Encode> Encode for Option<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        self.is_some().encode(out);
        if let Some(v) = self {
            v.encode(out);
        }
    }
}

impl<T: Encode> Encode for Vec<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        for v in self {
            true.encode(out);
            v.encode(out);
        }
        false.encode(out);
    }
}

impl<T: Encode, const N: usize> Encode for [T; N] {
    fn encode(&self, out: &mut Vec<u8>) {
        for v in self {
            v.encode(out);
        }
    }
}

/// Declares a `pub struct` (named fields) or `pub enum` (unit variants, variants with named
/// fields, variants with one unnamed field) deriving `Arbitrary`, `Clone`, `Debug`, `PartialEq`
/// and `Eq`, with its [`Encode`] impl. Every field's type must implement `Encode`. Doc comments
/// on the type, variants and fields are kept; fields are written with a trailing comma.
macro_rules! structured {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[$fmeta:meta])* pub $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(arbitrary::Arbitrary, Clone, Debug, PartialEq, Eq)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
        }

        impl $crate::encode::Encode for $name {
            fn encode(&self, out: &mut Vec<u8>) {
                $($crate::encode::Encode::encode(&self.$field, out);)*
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident
                $(($inner:ty))?
                $({ $($(#[$fmeta:meta])* $field:ident: $fty:ty,)* })?,
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(arbitrary::Arbitrary, Clone, Debug, PartialEq, Eq)]
        pub enum $name {
            $(
                $(#[$vmeta])*
                $variant
                $(($inner))?
                $({ $($(#[$fmeta])* $field: $fty,)* })?,
            )*
        }

        impl $crate::encode::Encode for $name {
            fn encode(&self, out: &mut Vec<u8>) {
                // The variants in declaration order: `Tag::X as u64` is X's index.
                #[allow(dead_code)]
                enum Tag {
                    $($variant,)*
                }
                let n = [$(Tag::$variant as u64,)*].len() as u64;
                match self {
                    $(
                        Self::$variant
                        $((structured!(@bind inner, $inner)))?
                        $({ $($field,)* })? => {
                            $crate::encode::tag(out, Tag::$variant as u64, n);
                            $($crate::encode::Encode::encode(structured!(@bind inner, $inner), out);)?
                            $($($crate::encode::Encode::encode($field, out);)*)?
                        }
                    )*
                }
            }
        }
    };
    // The binding of a variant's unnamed field: `$t` only drives the repetition.
    (@bind $i:ident, $t:ty) => {
        $i
    };
}
pub(crate) use structured;

#[cfg(test)]
mod tests {
    use super::*;

    structured! {
        /// Every shape the macro takes.
        pub struct Outer {
            pub flag: bool,
            pub items: Vec<Shape>,
            pub maybe: Option<u16>,
            pub last: Vec<Shape>,
        }
    }

    structured! {
        /// Unit, unnamed and named variants.
        pub enum Shape {
            Unit,
            One(u64),
            Named { a: u8, b: [u8; 3], },
            Nested(Option<u32>),
        }
    }

    #[test]
    fn every_shape_round_trips_through_arbitrary() {
        let shapes = vec![
            Shape::Unit,
            Shape::One(u64::MAX - 1),
            Shape::Named { a: 7, b: [1, 2, 3] },
            Shape::Nested(Some(9)),
            Shape::Nested(None),
        ];
        let v = Outer {
            flag: true,
            items: shapes.clone(),
            maybe: Some(0xbeef),
            last: shapes.into_iter().rev().collect(),
        };
        assert_eq!(decode::<Outer>(&v.to_bytes()), Ok(v));
    }

    #[test]
    fn tags_pick_their_variant_at_the_lowest_value() {
        for n in 1..=30u64 {
            for k in 0..n {
                let mut out = Vec::new();
                tag(&mut out, k, n);
                let x = u64::from(u32::from_le_bytes([out[0], out[1], out[2], out[3]]));
                assert_eq!((x * n) >> 32, k, "variant {k} of {n}");
                assert!(x == 0 || ((x - 1) * n) >> 32 < k, "not the lowest value");
            }
        }
    }
}
