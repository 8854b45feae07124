//! Counters declared from one list of names: [`counts!`], a plain set of `u64` counts, and
//! [`counter_set!`], a set of relaxed atomic event counters with such a set as its snapshot.

/// Declares, from one list of counter names (each with its documentation), a plain struct of
/// `u64` fields (`Default`: all zero) with `NAMES` and `values()` (every counter, in the order
/// declared) and `add()` (adds another set to this one).
macro_rules! counts {
    (
        $(#[$meta:meta])*
        $vis:vis struct $Counts:ident {
            $( $(#[$field_meta:meta])* $field:ident ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        $vis struct $Counts {
            $( $(#[$field_meta])* pub $field: u64, )*
        }

        #[allow(dead_code)]
        impl $Counts {
            /// Every counter's name, in the order declared.
            pub const NAMES: &'static [&'static str] = &[$( stringify!($field) ),*];

            /// Every counter's value, in the order declared.
            pub fn values(&self) -> impl Iterator<Item = u64> {
                [$( self.$field ),*].into_iter()
            }

            /// Adds every counter of `other` to this one.
            pub fn add(&mut self, other: &$Counts) {
                $( self.$field += other.$field; )*
            }
        }
    };
}

/// Declares, from one list of counter names (each with its documentation), a struct of
/// `AtomicU64` counters (`Default`: all zero; fields `pub(crate)`) and its snapshot, a
/// [`counts!`] struct with the same names, plus `read()`, which loads each counter once with
/// `Relaxed` ordering into a snapshot. How a counter is written (`fetch_add`, or a load and a
/// store by its only writer) is the user's choice.
macro_rules! counter_set {
    (
        $(#[$atomic_meta:meta])*
        $atomic_vis:vis struct $Atomic:ident;
        $(#[$snapshot_meta:meta])*
        $snapshot_vis:vis struct $Snapshot:ident {
            $( $(#[$field_meta:meta])* $field:ident ),* $(,)?
        }
    ) => {
        $(#[$atomic_meta])*
        #[derive(Debug, Default)]
        $atomic_vis struct $Atomic {
            $( pub(crate) $field: ::std::sync::atomic::AtomicU64, )*
        }

        $crate::counter_set::counts! {
            $(#[$snapshot_meta])*
            $snapshot_vis struct $Snapshot {
                $( $(#[$field_meta])* $field, )*
            }
        }

        impl $Atomic {
            /// A snapshot: each counter read once, relaxed.
            pub(crate) fn read(&self) -> $Snapshot {
                $Snapshot {
                    $( $field: self.$field.load(::std::sync::atomic::Ordering::Relaxed), )*
                }
            }
        }
    };
}

pub(crate) use counter_set;
pub(crate) use counts;
