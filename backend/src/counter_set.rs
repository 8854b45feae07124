//! [`counter_set!`]: a set of relaxed event counters and its snapshot, declared from one list.

/// Declares, from one list of counter names (each with its documentation), a struct of
/// `AtomicU64` counters (`Default`: all zero; fields `pub(crate)`) and a plain snapshot struct
/// of `u64` fields with the same names (`values()`: all of them, in order), plus `read()`,
/// which loads each counter once with `Relaxed` ordering into a snapshot. How a counter is
/// written (`fetch_add`, or a load and a store by its only writer) is the user's choice.
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

        $(#[$snapshot_meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        $snapshot_vis struct $Snapshot {
            $( $(#[$field_meta])* pub $field: u64, )*
        }

        impl $Snapshot {
            /// Every counter's name, in the order declared.
            #[allow(dead_code)]
            pub const NAMES: &'static [&'static str] = &[$( stringify!($field) ),*];

            /// Every counter's value, in the order declared.
            pub fn values(&self) -> impl Iterator<Item = u64> {
                [$( self.$field ),*].into_iter()
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
