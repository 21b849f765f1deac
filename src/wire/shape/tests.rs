use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde::{Deserialize, Deserializer};

use super::*;

/// How many times each type (by name) was traced, for the "once per type" test.
static TRACES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

pub(super) fn count_trace(name: &'static str) {
    TRACES.lock().unwrap().push(name);
}

fn shape<T: DeserializeOwned>() -> String {
    trace::<T>().description
}

fn print<T: DeserializeOwned>() -> u64 {
    trace::<T>().fingerprint()
}

#[allow(dead_code)]
mod v1 {
    #[derive(serde::Deserialize)]
    pub(super) struct Report {
        pub orders: u32,
        pub revenue_cents: u64,
    }
}

/// `v1::Report` declared again elsewhere: the same shape.
mod v1_again {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    pub(super) struct Report {
        orders: u32,
        revenue_cents: u64,
    }
}

#[allow(dead_code)]
mod changed {
    #[derive(serde::Deserialize)]
    pub(super) struct Reordered {
        revenue_cents: u64,
        orders: u32,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename = "Report")]
    pub(super) struct Reordered2 {
        revenue_cents: u64,
        orders: u32,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename = "Report")]
    pub(super) struct Renamed {
        orders: u32,
        revenue: u64,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename = "Report")]
    pub(super) struct Wider {
        orders: u64,
        revenue_cents: u64,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename = "Report")]
    pub(super) struct Added {
        orders: u32,
        revenue_cents: u64,
        refunds: u32,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename = "Report")]
    pub(super) struct Removed {
        orders: u32,
    }
}

#[test]
fn a_fixed_shape_has_a_fixed_fingerprint() {
    assert_eq!(
        shape::<v1::Report>(),
        "struct 6:Report{6:orders=u32,13:revenue_cents=u64}"
    );
    // The golden number: if this changes, every stored value becomes a miss after the upgrade.
    // Change it only with `SCHEME`, on purpose, and say so in the CHANGELOG.
    assert_eq!(print::<v1::Report>(), GOLDEN_REPORT);
    assert_eq!(fingerprint::<v1::Report>(), GOLDEN_REPORT);
    assert_eq!(print::<v1_again::Report>(), GOLDEN_REPORT);
}

/// FNV-1a 64 of "stampede-guard shape 1\n" and the description above (checked with an
/// independent implementation).
const GOLDEN_REPORT: u64 = 9_304_632_710_205_334_713;

#[test]
fn every_kind_of_change_changes_the_fingerprint() {
    let prints = [
        print::<v1::Report>(),
        print::<changed::Reordered>(),
        print::<changed::Reordered2>(),
        print::<changed::Renamed>(),
        print::<changed::Wider>(),
        print::<changed::Added>(),
        print::<changed::Removed>(),
        print::<(u32, u64)>(),
    ];
    for (i, a) in prints.iter().enumerate() {
        for b in &prints[i + 1..] {
            assert_ne!(a, b, "{prints:?}");
        }
    }
}

#[allow(dead_code)]
mod enums {
    #[derive(serde::Deserialize)]
    pub(super) enum Event {
        Started,
        Moved(u32),
        Resized(u16, u16),
        Renamed { from: String, to: String },
    }
    #[derive(serde::Deserialize)]
    #[serde(rename = "Event")]
    pub(super) enum Fewer {
        Started,
        Moved(u32),
        Resized(u16, u16),
    }
    #[derive(serde::Deserialize)]
    #[serde(rename = "Event")]
    pub(super) enum OtherKind {
        Started,
        Moved(u64),
        Resized(u16, u16),
        Renamed { from: String, to: String },
    }
    #[derive(serde::Deserialize)]
    pub(super) enum Outer {
        Plain,
        Inner(Option<Inner>),
    }
    #[derive(serde::Deserialize)]
    pub(super) enum Inner {
        X,
        Y(u8),
        Z { z: bool },
    }
}

#[test]
fn every_variant_is_traced() {
    assert_eq!(
        shape::<enums::Event>(),
        "enum 5:Event{7:Started=unit,5:Moved=newtype(u32),7:Resized=tuple(u16,u16),\
         7:Renamed=struct{4:from=str,2:to=str}}"
    );
    assert_ne!(print::<enums::Event>(), print::<enums::Fewer>());
    assert_ne!(print::<enums::Event>(), print::<enums::OtherKind>());
    // An enum inside another enum's variant: every variant of both.
    assert_eq!(
        shape::<enums::Outer>(),
        "enum 5:Outer{5:Plain=unit,5:Inner=newtype(option<enum 5:Inner{1:X=unit,1:Y=newtype(u8),\
         1:Z=struct{1:z=bool}}>)}"
    );
}

#[allow(dead_code)]
mod recursive {
    #[derive(serde::Deserialize)]
    pub(super) enum List {
        Cons(u32, Box<List>),
        Nil,
    }
    #[derive(serde::Deserialize)]
    pub(super) struct Tree {
        pub label: String,
        pub children: Vec<Tree>,
    }
    #[derive(serde::Deserialize)]
    pub(super) struct Node {
        pub next: Option<Box<Node>>,
        pub value: u32,
    }
    #[derive(serde::Deserialize)]
    pub(super) enum Expr {
        Add(Box<Expr>, Box<Expr>),
        Neg(Box<Expr>),
        Lit(i64),
        Names(std::collections::BTreeMap<String, Expr>),
    }
    /// Mutual recursion.
    #[derive(serde::Deserialize)]
    pub(super) struct Dir {
        pub files: Vec<File>,
    }
    #[derive(serde::Deserialize)]
    pub(super) struct File {
        pub name: String,
        pub inside: Option<Dir>,
    }
    /// No finite value at all.
    #[derive(serde::Deserialize)]
    pub(super) struct Endless(pub Box<Endless>);
}

#[test]
fn recursive_types_end() {
    assert_eq!(
        shape::<recursive::List>(),
        "enum 4:List{4:Cons=tuple(u32,@4:List),3:Nil=unit}"
    );
    assert_eq!(
        shape::<recursive::Tree>(),
        "struct 4:Tree{5:label=str,8:children=seq<@4:Tree>}"
    );
    assert_eq!(
        shape::<recursive::Node>(),
        "struct 4:Node{4:next=option<@4:Node>,5:value=u32}"
    );
    assert_eq!(
        shape::<recursive::Expr>(),
        "enum 4:Expr{3:Add=tuple(@4:Expr,@4:Expr),3:Neg=newtype(@4:Expr),3:Lit=newtype(i64),\
         5:Names=newtype(map<str,@4:Expr>)}"
    );
    assert_eq!(
        shape::<recursive::Dir>(),
        "struct 3:Dir{5:files=seq<struct 4:File{4:name=str,6:inside=option<@3:Dir>}>}"
    );
    // Gives up at the depth limit, with a number all the same.
    let endless = trace::<recursive::Endless>();
    assert!(endless.gaps.is_some());
    assert_eq!(endless.fingerprint(), print::<recursive::Endless>());
}

#[test]
fn the_types_that_worked_before_have_shapes() {
    assert_eq!(shape::<String>(), "str");
    assert_eq!(shape::<Box<str>>(), "str");
    assert_eq!(shape::<Vec<u8>>(), "seq<u8>");
    assert_eq!(shape::<f64>(), "f64");
    assert_eq!(
        shape::<(u8, String, Option<bool>)>(),
        "tuple(u8,str,option<bool>)"
    );
    assert_eq!(shape::<HashMap<String, Vec<u64>>>(), "map<str,seq<u64>>");
    assert_eq!(
        shape::<BTreeMap<u32, (i8, char)>>(),
        "map<u32,tuple(i8,char)>"
    );
    assert_eq!(shape::<[u16; 3]>(), "tuple(u16,u16,u16)");
    assert_eq!(shape::<()>(), "unit");
    assert_eq!(
        shape::<std::time::Duration>(),
        "struct 8:Duration{4:secs=u64,5:nanos=u32}"
    );
    assert_eq!(
        shape::<(
            char,
            std::borrow::Cow<'static, str>,
            Box<[u32]>,
            std::collections::HashSet<i16>
        )>(),
        "tuple(char,str,seq<u32>,seq<i16>)"
    );
    // Traced as bincode stores it (not human-readable): an enum of byte tuples, not text.
    assert!(
        shape::<std::net::IpAddr>().starts_with("enum 6:IpAddr{2:V4=newtype(tuple(u8,u8,u8,u8)),")
    );
    for description in [
        shape::<String>(),
        shape::<Vec<recursive::Tree>>(),
        shape::<Option<enums::Event>>(),
    ] {
        assert!(!description.contains('?'), "{description}");
    }
}

#[allow(dead_code)]
mod opaque {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    pub(super) enum Loose {
        Number(u64),
        Text(String),
    }

    #[derive(serde::Deserialize)]
    pub(super) struct WithLoose {
        pub loose: Loose,
        pub after: u32,
    }

    #[derive(serde::Deserialize)]
    #[serde(tag = "type")]
    pub(super) enum Tagged {
        A { x: u8 },
        B,
    }

    #[derive(serde::Deserialize)]
    pub(super) struct Flattened {
        pub id: u32,
        #[serde(flatten)]
        pub rest: HashMap<String, String>,
    }

    /// Refuses zero (as `NonZeroU32` does).
    pub(super) struct Positive(pub u32);

    impl<'de> Deserialize<'de> for Positive {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            match u32::deserialize(d)? {
                0 => Err(serde::de::Error::custom("must be positive")),
                n => Ok(Positive(n)),
            }
        }
    }

    /// Parses a date from text, as chrono's `NaiveDate` does.
    pub(super) struct Day(pub String);

    impl<'de> Deserialize<'de> for Day {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let text = String::deserialize(d)?;
            let b = text.as_bytes();
            if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
                return Err(serde::de::Error::custom("not a date"));
            }
            Ok(Day(text))
        }
    }

    /// Sixteen bytes, as a UUID is stored by bincode.
    pub(super) struct Id(pub [u8; 16]);

    impl<'de> Deserialize<'de> for Id {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let bytes = serde_bytes_like(d)?;
            let id = bytes
                .try_into()
                .map_err(|_| serde::de::Error::custom("not 16 bytes"))?;
            Ok(Id(id))
        }
    }

    fn serde_bytes_like<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl serde::de::Visitor<'_> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
        }
        d.deserialize_bytes(Bytes)
    }

    #[derive(serde::Deserialize)]
    pub(super) struct Validated {
        pub count: Positive,
        pub day: Day,
        pub id: Id,
        pub after: u64,
    }

    /// Refuses every value.
    pub(super) struct Never;

    impl<'de> Deserialize<'de> for Never {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            u32::deserialize(d)?;
            Err(serde::de::Error::custom("never"))
        }
    }

    #[derive(serde::Deserialize)]
    pub(super) struct Guarded {
        pub before: String,
        pub guard: Never,
        pub after: u64,
    }

    #[derive(serde::Deserialize)]
    #[serde(rename = "Guarded")]
    pub(super) struct GuardedRenamed {
        pub before: String,
        pub guard: Never,
        pub later: u64,
    }

    pub(super) static PANICS: AtomicUsize = AtomicUsize::new(0);

    /// Panics on every value.
    pub(super) struct Fragile;

    impl<'de> Deserialize<'de> for Fragile {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            bool::deserialize(d)?;
            PANICS.fetch_add(1, Ordering::SeqCst);
            panic!("Fragile: not what it expected");
        }
    }
}

#[test]
fn placeholders_that_a_type_refuses_are_replaced() {
    // A non-zero number, a date in text and sixteen bytes: each refuses the first placeholder
    // of its kind and takes a later one, so the fields after them are still seen.
    let validated = trace::<opaque::Validated>();
    assert_eq!(
        validated.description,
        "struct 9:Validated{5:count=u32,3:day=str,2:id=bytes,5:after=u64}"
    );
    assert_eq!(validated.gaps, None);
}

#[test]
fn what_tracing_cannot_see_gives_a_weaker_fingerprint_not_a_failure() {
    assert_eq!(shape::<serde_json::Value>(), "any");
    assert_eq!(shape::<opaque::Loose>(), "any");
    assert_eq!(shape::<opaque::Tagged>(), "any");
    assert_eq!(
        shape::<opaque::WithLoose>(),
        "struct 9:WithLoose{5:loose=any,5:after=u32}"
    );
    // `flatten` reads a map of whatever comes: bincode cannot read it either.
    assert_eq!(shape::<opaque::Flattened>(), "map<identifier,any>");
    // A Deserialize that refuses everything: the fields before it and every field name are
    // still seen, so a rename after it is still a change.
    let guarded = trace::<opaque::Guarded>();
    assert_eq!(
        guarded.description,
        "struct 7:Guarded{6:before=str,5:guard=u32,5:after=?}"
    );
    assert_eq!(guarded.gaps.as_deref(), Some("never"));
    assert_ne!(guarded.fingerprint(), print::<opaque::GuardedRenamed>());
    // A panicking one: caught, once per placeholder, never reaching the caller.
    let fragile = trace::<opaque::Fragile>();
    assert_eq!(fragile.description, "bool");
    assert!(fragile.gaps.is_some());
    assert_eq!(opaque::PANICS.load(std::sync::atomic::Ordering::SeqCst), 2);
    // And the cached path gives numbers for all of them.
    let _ = fingerprint::<serde_json::Value>();
    let _ = fingerprint::<opaque::Tagged>();
}

#[test]
fn each_type_is_traced_once() {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct TracedOnce {
        a: u8,
    }
    let name = std::any::type_name::<TracedOnce>();
    let first = fingerprint::<TracedOnce>();
    let threads: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(fingerprint::<TracedOnce>))
        .collect();
    for thread in threads {
        assert_eq!(thread.join().unwrap(), first);
    }
    assert_eq!(fingerprint::<TracedOnce>(), first);
    let traces = TRACES.lock().unwrap();
    assert_eq!(traces.iter().filter(|n| **n == name).count(), 1);
}

#[test]
fn the_hash_is_fnv1a_64() {
    // The published test vectors of FNV-1a, 64 bits.
    assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
}

#[allow(dead_code)]
mod nested {
    #[derive(serde::Deserialize)]
    pub(super) enum A {
        A0,
        A1(u8),
        A2(B, B),
    }
    #[derive(serde::Deserialize)]
    pub(super) enum B {
        B0,
        B1 { c: Option<C> },
        B2(Vec<A>),
    }
    #[derive(serde::Deserialize)]
    pub(super) enum C {
        C0(bool),
        C1,
        C2(Box<A>),
    }
}

#[test]
fn enums_inside_variants_are_seen_whole() {
    let a = shape::<nested::A>();
    assert!(!a.contains('?'), "{a}");
    for variant in ["A0=", "A2=", "B0=", "B1=", "B2=", "C0=", "C1=", "C2="] {
        assert!(a.contains(variant), "{variant} in {a}");
    }
    // Every enum position is walked through all its variants.
    assert_eq!(a.matches("enum 1:B{").count(), 2, "{a}");
    assert_eq!(a.matches("@1:A").count(), 4, "{a}");
}

#[test]
fn type_ids_keep_their_own_hash() {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let build = BuildHasherDefault::<TypeIdHasher>::default();
    let a = build.hash_one(TypeId::of::<u32>());
    let b = build.hash_one(TypeId::of::<String>());
    assert_ne!(a, b);
    assert_ne!(a, 0);
    let mut map = ByType::default();
    map.insert(TypeId::of::<u32>(), 1);
    map.insert(TypeId::of::<String>(), 2);
    assert_eq!(map.get(&TypeId::of::<String>()), Some(&2));
}
