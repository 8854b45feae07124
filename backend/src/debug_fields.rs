//! [`debug_fields!`]: `Debug` for a type whose fields are not all `Debug` (trait objects,
//! sockets, threads).

/// Implements `Debug` for `$T` as a struct of the named values, computed from the value
/// (bound to `$s`), and `..` for the rest: `debug_fields!(Engine, |e| workers: e.workers.len())`.
macro_rules! debug_fields {
    ($T:ident $(<$lt:lifetime>)?, |$s:ident| $($name:ident: $value:expr),+ $(,)?) => {
        impl ::std::fmt::Debug for $T $(<$lt>)? {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                let $s = self;
                f.debug_struct(stringify!($T))
                    $( .field(stringify!($name), &$value) )+
                    .finish_non_exhaustive()
            }
        }
    };
}

pub(crate) use debug_fields;
