//! The canonical description of a traced shape, the text the fingerprint hashes. Its form is
//! part of every fingerprint: a change here changes every stored value's fingerprint, so it
//! comes only with [`SCHEME`](super::SCHEME) changed.

use std::fmt::Write;

use super::{Kind, Node, Path, Walk};

impl Walk {
    /// Writes the canonical description of the part at `path`. Names are length-prefixed, so
    /// no name can make two shapes read alike.
    pub(super) fn render(&self, path: &mut Path, out: &mut String) {
        let Some(&node) = self.nodes.get(path) else {
            out.push('?');
            return;
        };
        match node {
            Node::Leaf(leaf) => out.push_str(leaf),
            Node::Option => self.enclosed(path, out, "option<", 1, '>'),
            Node::Seq => self.enclosed(path, out, "seq<", 1, '>'),
            Node::Map => self.enclosed(path, out, "map<", 2, '>'),
            Node::Tuple(len) => self.enclosed(path, out, "tuple(", len, ')'),
            Node::UnitStruct(n) => {
                out.push_str("unit_struct ");
                name(out, n);
            }
            Node::NewtypeStruct(n) => {
                out.push_str("newtype_struct ");
                name(out, n);
                self.enclosed(path, out, "(", 1, ')');
            }
            Node::TupleStruct(n, len) => {
                out.push_str("tuple_struct ");
                name(out, n);
                self.enclosed(path, out, "(", len, ')');
            }
            Node::Struct(n, names) => {
                out.push_str("struct ");
                name(out, n);
                self.fields(path, out, names);
            }
            Node::Enum(n, variants) => {
                out.push_str("enum ");
                name(out, n);
                // Variants are written like fields: each name, then its shape.
                self.fields(path, out, variants);
            }
            Node::Variant(Kind::Unit) => out.push_str("unit"),
            Node::Variant(Kind::Newtype) => self.enclosed(path, out, "newtype(", 1, ')'),
            Node::Variant(Kind::Tuple(len)) => self.enclosed(path, out, "tuple(", len, ')'),
            Node::Variant(Kind::Struct(names)) => {
                out.push_str("struct");
                self.fields(path, out, names);
            }
            Node::Again(n) => {
                out.push('@');
                name(out, n);
            }
        }
    }

    /// `open`, the first `count` parts under `path` separated by commas, then `close`.
    fn enclosed(&self, path: &mut Path, out: &mut String, open: &str, count: usize, close: char) {
        out.push_str(open);
        for i in 0..count {
            if i > 0 {
                out.push(',');
            }
            self.render_child(path, out, i);
        }
        out.push(close);
    }

    /// The parts under `path` as `{name=shape,...}`, one per name (fields, or variants).
    fn fields(&self, path: &mut Path, out: &mut String, names: &[&str]) {
        out.push('{');
        for (i, field) in names.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            name(out, field);
            out.push('=');
            self.render_child(path, out, i);
        }
        out.push('}');
    }

    /// The part one step down `path`, at step `i`.
    fn render_child(&self, path: &mut Path, out: &mut String, i: usize) {
        path.push(u32::try_from(i).unwrap_or(u32::MAX));
        self.render(path, out);
        path.pop();
    }
}

/// A name, length-prefixed (`6:Report`).
fn name(out: &mut String, name: &str) {
    let _ = write!(out, "{}:{name}", name.len());
}
