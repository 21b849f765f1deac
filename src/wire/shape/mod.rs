//! The shape of a stored value's type, as serde sees it, and its 64-bit fingerprint.
//!
//! bincode is positional: a value written as `Report { orders, revenue_cents }` decodes without
//! error as a `Report { revenue_cents, orders }`, with the numbers swapped. So every envelope
//! records the fingerprint of the shape of the type it was written for, and a reader whose type
//! has another shape takes the value for a miss (see [`Codec`](crate::Codec), "Type changes").
//!
//! The shape is traced once per type by running `T::deserialize` against `Probe`, a
//! deserializer that answers every request with a placeholder value and writes down what was
//! asked: struct, enum and field names in order, variant names, and the type of every field,
//! recursively, each at its path from the root. It takes several passes: one per enum variant
//! not yet seen, and one more wherever a `Deserialize` refused a placeholder (a zero, an empty
//! string), which then gets the next one of its kind. A type met again inside itself is noted
//! as a back reference and walked on quietly, taking the shortest way out (no `Some`, no
//! elements, a variant not already being walked), so recursive types end. The description is
//! hashed with FNV-1a, which is fixed: the same shape gives the same number in every process,
//! build and Rust version. `serde-reflection` does the same tracing, but stops with an error at
//! the first `deserialize_any` or refused value, where this gives a weaker number and goes on.
//!
//! Invariants: tracing never panics the caller (a panicking `Deserialize` is caught) and always
//! gives a number; where it cannot see (a `Deserialize` that refuses every placeholder, a type
//! that asks for `deserialize_any`), the description says so at that place (`?`, `any`) and the
//! number covers the rest. The hit path pays a per-thread map lookup and a compare, never a trace.
//!
//! Explained in the guide: `docs/guarantees.md` (Changing a cached type).

mod render;

use std::any::TypeId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{LazyLock, PoisonError, RwLock};

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, EnumAccess, IntoDeserializer, MapAccess, SeqAccess,
    VariantAccess, Visitor,
};

/// Named in every description: a change of the description's form changes every fingerprint,
/// on purpose, so it must come with this name changed.
const SCHEME: &str = "stampede-guard shape 1";

/// Deeper than this, a walk is given up (a type that only ends through itself, such as
/// `struct A(Box<A>)`, has no finite value).
const MAX_DEPTH: usize = 256;

/// Passes over a type: one per enum variant to be seen, more where enums nest.
const MAX_PASSES: usize = 1024;

/// Passes in a row that see nothing new before tracing gives up looking.
const MAX_IDLE_PASSES: usize = 64;

/// The fingerprint of the shape of `T`: traced on the first call for `T` in this process, then a
/// map lookup (per thread, then shared).
pub(crate) fn fingerprint<T: DeserializeOwned + 'static>() -> u64 {
    let id = TypeId::of::<T>();
    let near = NEAR.try_with(|near| near.borrow().get(&id).copied());
    if let Ok(Some(fingerprint)) = near {
        return fingerprint;
    }
    let fingerprint = shared::<T>(id);
    // A thread being torn down has no map any more: it just asks the shared one next time.
    let _ = NEAR.try_with(|near| near.borrow_mut().insert(id, fingerprint));
    fingerprint
}

/// `TypeId`s hash themselves to a well-mixed `u64`: hashing that again would be wasted work.
#[derive(Default)]
struct TypeIdHasher(u64);

impl Hasher for TypeIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not used by `TypeId` today; if it ever is, stay correct.
        self.0 = fnv1a(self.0, bytes);
    }
}

type ByType = HashMap<TypeId, u64, BuildHasherDefault<TypeIdHasher>>;

thread_local! {
    /// Each thread's copy of what it asked for: the hit path touches no shared cache line.
    static NEAR: RefCell<ByType> = RefCell::default();
}

/// Every fingerprint traced in this process.
static TRACED: LazyLock<RwLock<ByType>> = LazyLock::new(RwLock::default);

fn shared<T: DeserializeOwned + 'static>(id: TypeId) -> u64 {
    // Nothing panics while the lock is held (no user code runs under it), so poisoning cannot
    // mean a half-written map.
    let known = TRACED
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&id)
        .copied();
    if let Some(fingerprint) = known {
        return fingerprint;
    }
    // Traced outside the lock: `T::deserialize` is the user's code. Two threads meeting a type
    // for the first time at the same moment may both trace it; they get the same number.
    let traced = trace::<T>();
    if traced.gaps.is_some() || traced.description.contains('?') {
        tracing::debug!(
            r#type = std::any::type_name::<T>(),
            shape = %traced.description,
            reason = traced.gaps.as_deref().unwrap_or("not every part was reached"),
            "the shape of this type is only partly traced: a change hidden where it shows `?` or `any` is not detected"
        );
    }
    let fingerprint = traced.fingerprint();
    *TRACED
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(id)
        .or_insert(fingerprint)
}

/// FNV-1a, 64 bits: fixed constants, so stable across processes, builds and Rust versions
/// (unlike `DefaultHasher`, whose algorithm may change).
fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// A traced shape.
#[derive(Debug, Clone)]
pub(crate) struct Traced {
    /// The canonical description: `?` where the walk never came, `any` where the type decides
    /// its shape from the data.
    pub description: String,
    /// Why the last pass stopped early, if it did.
    pub gaps: Option<String>,
}

impl Traced {
    pub(crate) fn fingerprint(&self) -> u64 {
        let hash = fnv1a(FNV_OFFSET, SCHEME.as_bytes());
        let hash = fnv1a(hash, b"\n");
        fnv1a(hash, self.description.as_bytes())
    }
}

/// Traces the shape of `T` (uncached).
pub(crate) fn trace<T: DeserializeOwned>() -> Traced {
    #[cfg(test)]
    tests::count_trace(std::any::type_name::<T>());
    let mut walk = Walk::default();
    let mut gaps = None;
    let mut idle = 0;
    for _ in 0..MAX_PASSES {
        walk.start_pass();
        let pass = catch_unwind(AssertUnwindSafe(|| {
            T::deserialize(Probe(&mut walk)).map(drop)
        }));
        let (failed, panicked) = match &pass {
            Ok(Ok(())) => (false, false),
            Ok(Err(_)) => (true, false),
            Err(_) => (true, true),
        };
        gaps = match pass {
            Ok(Ok(())) => None,
            Ok(Err(failure)) => Some(failure.0),
            Err(_) => Some("its Deserialize panicked on a placeholder value".to_string()),
        };
        let retry = failed && walk.try_another_placeholder();
        idle = if walk.progress || retry { 0 } else { idle + 1 };
        // A panic is loud (the panic hook prints it): repeat it only to try another answer.
        let done = if retry {
            false
        } else {
            panicked || walk.every_variant_seen()
        };
        if done || idle >= MAX_IDLE_PASSES {
            break;
        }
    }
    let mut description = String::new();
    walk.render(&mut Vec::new(), &mut description);
    Traced { description, gaps }
}

/// Where in the type a part sits: the steps from the root (field, element or variant numbers).
type Path = Vec<u32>;

/// What was asked for at one place in the type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    /// A primitive, by name ("u32", "str", ...); also "any" for `deserialize_any`.
    Leaf(&'static str),
    Option,
    Seq,
    Map,
    Tuple(usize),
    UnitStruct(&'static str),
    NewtypeStruct(&'static str),
    TupleStruct(&'static str, usize),
    Struct(&'static str, &'static [&'static str]),
    Enum(&'static str, &'static [&'static str]),
    /// At an enum's path plus the variant's number.
    Variant(Kind),
    /// A type met again inside itself.
    Again(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Unit,
    Newtype,
    Tuple(usize),
    Struct(&'static [&'static str]),
}

/// A named type being walked, to see recursion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frame {
    node: Node,
    /// For an enum: the variant being walked.
    variant: Option<u32>,
}

#[derive(Debug, Default)]
struct Walk {
    /// Everything seen, over all passes.
    nodes: HashMap<Path, Node>,
    path: Path,
    stack: Vec<Frame>,
    /// Above zero inside a type met again inside itself: nothing is written down there, and
    /// every choice takes the shortest way out.
    quiet: u32,
    /// How often each enum was walked once all its variants had been seen (to take turns).
    turns: HashMap<Path, usize>,
    /// Whether this pass wrote anything down that earlier passes had not.
    progress: bool,
    /// Which placeholder each primitive gets (an index into its answers; 0 when not listed).
    placeholders: HashMap<Path, usize>,
    /// The last primitive answered in this pass and how many answers it has: when the pass
    /// fails, most likely the one refused.
    last_leaf: Option<(Path, usize)>,
}

impl Walk {
    fn start_pass(&mut self) {
        self.path.clear();
        self.stack.clear();
        self.quiet = 0;
        self.progress = false;
        self.last_leaf = None;
    }

    /// Notes a primitive; says which of its `answers` placeholders to give.
    fn leaf(&mut self, name: &'static str, answers: usize) -> usize {
        self.record(Node::Leaf(name));
        let tried = self.placeholders.get(&self.path).copied().unwrap_or(0);
        self.last_leaf = Some((self.path.clone(), answers));
        tried.min(answers.saturating_sub(1))
    }

    /// After a failed pass: gives the primitive answered last its next placeholder, if it has one.
    fn try_another_placeholder(&mut self) -> bool {
        let Some((path, answers)) = self.last_leaf.take() else {
            return false;
        };
        let tried = self.placeholders.entry(path).or_default();
        if *tried + 1 < answers {
            *tried += 1;
            true
        } else {
            false
        }
    }

    fn record(&mut self, node: Node) {
        if self.quiet == 0 && !self.nodes.contains_key(&self.path) {
            self.nodes.insert(self.path.clone(), node);
            self.progress = true;
        }
    }

    /// Runs `f` one step down the path.
    fn child<R>(&mut self, step: u32, f: impl FnOnce(&mut Self) -> R) -> R {
        self.path.push(step);
        let result = f(self);
        self.path.pop();
        result
    }

    /// Walks a named type: noted, or noted as met again (then walked quietly).
    fn named<R>(
        &mut self,
        node: Node,
        walk: impl FnOnce(&mut Self) -> Result<R, Failure>,
    ) -> Result<R, Failure> {
        if self.path.len() > MAX_DEPTH {
            return Err(Failure(format!(
                "deeper than {MAX_DEPTH} levels (a type with no finite value?)"
            )));
        }
        let again = self.stack.iter().any(|frame| frame.node == node);
        if again {
            self.record(Node::Again(name_of(node)));
            self.quiet += 1;
        } else {
            self.record(node);
        }
        self.stack.push(Frame {
            node,
            variant: None,
        });
        let result = walk(self);
        self.stack.pop();
        if again {
            self.quiet -= 1;
        }
        result
    }

    /// Picks the variant of the enum on top of the stack to walk in this pass.
    fn choose(&mut self, count: usize) -> Result<u32, Failure> {
        if count == 0 {
            return Err(Failure("an enum without variants has no value".into()));
        }
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        let choice = if self.quiet == 0 {
            // The first variant not seen yet; once all are, each in turn (an enum inside one of
            // them may still have variants to see).
            let unseen = (0..count).find(|&i| {
                self.path.push(i);
                let seen = self.nodes.contains_key(&self.path);
                self.path.pop();
                !seen
            });
            match unseen {
                Some(i) => i,
                None => {
                    let turn = self.turns.entry(self.path.clone()).or_default();
                    *turn += 1;
                    u32::try_from(*turn % count as usize).unwrap_or(0)
                }
            }
        } else {
            // The shortest way out: a variant not already being walked further up.
            let (top, outer) = self
                .stack
                .split_last()
                .ok_or_else(|| Failure("no enum".into()))?;
            let busy = |i: u32| {
                outer
                    .iter()
                    .any(|frame| frame.node == top.node && frame.variant == Some(i))
            };
            (0..count).find(|&i| !busy(i)).unwrap_or(0)
        };
        if let Some(top) = self.stack.last_mut() {
            top.variant = Some(choice);
        }
        Ok(choice)
    }

    fn every_variant_seen(&self) -> bool {
        self.nodes.iter().all(|(path, node)| match node {
            Node::Enum(_, variants) => (0..variants.len()).all(|i| {
                let mut variant = path.clone();
                variant.push(u32::try_from(i).unwrap_or(u32::MAX));
                self.nodes.contains_key(&variant)
            }),
            _ => true,
        })
    }
}

fn name_of(node: Node) -> &'static str {
    match node {
        Node::UnitStruct(n)
        | Node::NewtypeStruct(n)
        | Node::TupleStruct(n, _)
        | Node::Struct(n, _)
        | Node::Enum(n, _)
        | Node::Again(n) => n,
        _ => "",
    }
}

/// Why a pass stopped: a `Deserialize` refused a placeholder, or the walk went too deep.
#[derive(Debug)]
struct Failure(String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

impl de::Error for Failure {
    fn custom<M: fmt::Display>(message: M) -> Self {
        Failure(message.to_string())
    }
}

/// The deserializer that writes down what it is asked for, at the walk's current path.
struct Probe<'w>(&'w mut Walk);

/// A primitive: noted, then answered with a placeholder. Where a `Deserialize` refuses one (a
/// non-zero number, a date in a string, a 16-byte id), the next pass answers that place with the
/// next one; the answers are part of what the fingerprint reaches, so changing them is a change
/// of `SCHEME`.
macro_rules! leaves {
    ($($method:ident, $name:literal, [$($answer:expr),+ $(,)?];)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
            let answers: &[fn(V) -> Result<V::Value, Failure>] = &[$($answer),+];
            let i = self.0.leaf($name, answers.len());
            answers[i](visitor)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = Failure;

    // bincode is not human-readable; types that encode themselves differently for the two kinds
    // (addresses, times) are traced in the form bincode stores.
    fn is_human_readable(&self) -> bool {
        false
    }

    // `String` and `&str` are one shape, traced with the same placeholders.
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        self.deserialize_str(visitor)
    }

    leaves! {
        deserialize_bool, "bool", [|v| v.visit_bool(false), |v| v.visit_bool(true)];
        // 1 before 0: `NonZero*` and most ranges (days, ordinals) take it.
        deserialize_i8, "i8", [|v| v.visit_i8(1), |v| v.visit_i8(0)];
        deserialize_i16, "i16", [|v| v.visit_i16(1), |v| v.visit_i16(0)];
        deserialize_i32, "i32", [|v| v.visit_i32(1), |v| v.visit_i32(0)];
        deserialize_i64, "i64", [|v| v.visit_i64(1), |v| v.visit_i64(0)];
        deserialize_i128, "i128", [|v| v.visit_i128(1), |v| v.visit_i128(0)];
        deserialize_u8, "u8", [|v| v.visit_u8(1), |v| v.visit_u8(0)];
        deserialize_u16, "u16", [|v| v.visit_u16(1), |v| v.visit_u16(0)];
        deserialize_u32, "u32", [|v| v.visit_u32(1), |v| v.visit_u32(0)];
        deserialize_u64, "u64", [|v| v.visit_u64(1), |v| v.visit_u64(0)];
        deserialize_u128, "u128", [|v| v.visit_u128(1), |v| v.visit_u128(0)];
        deserialize_f32, "f32", [|v| v.visit_f32(1.0), |v| v.visit_f32(0.0)];
        deserialize_f64, "f64", [|v| v.visit_f64(1.0), |v| v.visit_f64(0.0)];
        deserialize_char, "char", [|v| v.visit_char('a')];
        // `String` and `Box<str>`, `Vec<u8>`-as-bytes and `ByteBuf` are stored alike: one name
        // each. Text that types parse: times and dates (chrono, in every format), numbers.
        deserialize_str, "str", [
            |v| v.visit_str(""),
            |v| v.visit_str("1970-01-01T00:00:00Z"),
            |v| v.visit_str("1970-01-01T00:00:00"),
            |v| v.visit_str("1970-01-01"),
            |v| v.visit_str("00:00:00"),
            |v| v.visit_str("1"),
            |v| v.visit_str("a"),
        ];
        // Empty, then 16 bytes (a UUID, as bincode stores it).
        deserialize_bytes, "bytes", [|v| v.visit_bytes(&[]), |v| v.visit_bytes(&[0; 16])];
        deserialize_byte_buf, "bytes", [|v| v.visit_bytes(&[]), |v| v.visit_bytes(&[0; 16])];
        deserialize_unit, "unit", [|v| v.visit_unit()];
        deserialize_identifier, "identifier", [|v| v.visit_u32(0), |v| v.visit_str("")];
        deserialize_ignored_any, "ignored", [|v| v.visit_unit()];
        // The type decides from the data (`serde_json::Value`, untagged enums): its shape
        // cannot be seen. The answers only let the walk go on to what comes after it.
        deserialize_any, "any", [
            |v| v.visit_unit(),
            |v| v.visit_u64(1),
            |v| v.visit_str(""),
            |v| v.visit_seq(de::value::SeqDeserializer::new(std::iter::empty::<()>())),
            |v| v.visit_map(de::value::MapDeserializer::new(std::iter::empty::<((), ())>())),
        ];
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        self.0.record(Node::Option);
        if self.0.quiet > 0 {
            return visitor.visit_none();
        }
        self.0.child(0, |walk| visitor.visit_some(Probe(walk)))
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Failure> {
        self.0.record(Node::UnitStruct(name));
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Failure> {
        self.0.named(Node::NewtypeStruct(name), |walk| {
            walk.child(0, |walk| visitor.visit_newtype_struct(Probe(walk)))
        })
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        self.0.record(Node::Seq);
        // One element shows the element's type; none where the walk must end.
        let len = if self.0.quiet > 0 { 0 } else { 1 };
        visitor.visit_seq(Elements::new(self.0, len))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Failure> {
        self.0.record(Node::Tuple(len));
        visitor.visit_seq(Elements::new(self.0, len))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Failure> {
        self.0.named(Node::TupleStruct(name, len), |walk| {
            visitor.visit_seq(Elements::new(walk, len))
        })
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Failure> {
        self.0.record(Node::Map);
        let entries = if self.0.quiet > 0 { 0 } else { 1 };
        visitor.visit_map(Entries {
            walk: self.0,
            left: entries,
        })
    }

    // Fields come as a sequence, in order, as bincode gives them.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Failure> {
        self.0.named(Node::Struct(name, fields), |walk| {
            visitor.visit_seq(Elements::new(walk, fields.len()))
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Failure> {
        self.0.named(Node::Enum(name, variants), |walk| {
            let index = walk.choose(variants.len())?;
            visitor.visit_enum(Choice { walk, index })
        })
    }
}

/// The elements of a sequence, tuple or struct: `len` of them, each at its own step.
struct Elements<'w> {
    walk: &'w mut Walk,
    len: u32,
    next: u32,
}

impl<'w> Elements<'w> {
    fn new(walk: &'w mut Walk, len: usize) -> Self {
        Elements {
            walk,
            len: u32::try_from(len).unwrap_or(u32::MAX),
            next: 0,
        }
    }
}

impl<'de> SeqAccess<'de> for Elements<'_> {
    type Error = Failure;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, Failure> {
        if self.next >= self.len {
            return Ok(None);
        }
        let step = self.next;
        self.next += 1;
        self.walk
            .child(step, |walk| seed.deserialize(Probe(walk)))
            .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        usize::try_from(self.len - self.next).ok()
    }
}

/// The entries of a map: at most one, its key at step 0 and its value at step 1.
struct Entries<'w> {
    walk: &'w mut Walk,
    left: usize,
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = Failure;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Failure> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        self.walk
            .child(0, |walk| seed.deserialize(Probe(walk)))
            .map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Failure> {
        self.walk.child(1, |walk| seed.deserialize(Probe(walk)))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

/// The variant chosen for this pass, named by its number as bincode names it.
struct Choice<'w> {
    walk: &'w mut Walk,
    index: u32,
}

impl<'de, 'w> EnumAccess<'de> for Choice<'w> {
    type Error = Failure;
    type Variant = Self;

    fn variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<(S::Value, Self), Failure> {
        let deserializer: de::value::U32Deserializer<Failure> = self.index.into_deserializer();
        let variant = seed.deserialize(deserializer)?;
        Ok((variant, self))
    }
}

impl<'de> VariantAccess<'de> for Choice<'_> {
    type Error = Failure;

    fn unit_variant(self) -> Result<(), Failure> {
        self.walk
            .child(self.index, |walk| walk.record(Node::Variant(Kind::Unit)));
        Ok(())
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, Failure> {
        self.walk.child(self.index, |walk| {
            walk.record(Node::Variant(Kind::Newtype));
            walk.child(0, |walk| seed.deserialize(Probe(walk)))
        })
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Failure> {
        self.walk.child(self.index, |walk| {
            walk.record(Node::Variant(Kind::Tuple(len)));
            visitor.visit_seq(Elements::new(walk, len))
        })
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Failure> {
        self.walk.child(self.index, |walk| {
            walk.record(Node::Variant(Kind::Struct(fields)));
            visitor.visit_seq(Elements::new(walk, fields.len()))
        })
    }
}

#[cfg(test)]
mod tests;
