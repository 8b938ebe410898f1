//! The modules' layering (src/lib.rs "Layout": layers point one way), checked on the source
//! itself: inside each folder of modules (a "room": the children of one module), no two or
//! more sibling modules refer to each other in a circle. A circle makes neither module the
//! lower one, so neither can be read, tested or moved without the other.
//!
//! A text scan, not a compiler: it reads every module of the library and of the binary from
//! `src/lib.rs` and `src/main.rs` down (`mod NAME;` and inline `mod NAME { }`), with comments,
//! doc comments and literals blanked, and takes as a reference from module A to its sibling B
//! any path that resolves into B: `super::B::X`, `crate::ROOM::B::X`, a `use` group naming B,
//! an item the parent re-exports from B (`super::X` with `pub use B::X` in the parent), and,
//! where A glob-imports its parent (`use super::*`), a re-exported name or `B::` it then
//! writes bare. A reference from deeper down (a child of A) counts as A's. Items under
//! `#[cfg(test)]` (test modules, test-only imports) are left out: tests may reach across a
//! room (a module's tests driving its sibling's types) without making the code circular.
//! Method calls on a type another sibling extends (`impl Parent { fn f() }`) are not paths
//! and are not seen.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path from its crate's root (empty for the root).
type ModPath = Vec<String>;

/// One module of a crate: its code (blanked, test items and inline child modules cut out),
/// its children, and the names it imports from its children (`pub use child::X`).
struct Module {
    file: PathBuf,
    code: Vec<char>,
    children: BTreeSet<String>,
    reexports: BTreeMap<String, String>,
}

/// A crate's modules by path.
struct Crate {
    root: &'static str,
    modules: BTreeMap<ModPath, Module>,
}

#[test]
fn sibling_modules_refer_to_each_other_in_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut circles = Vec::new();
    for (root, file) in [("crate", "lib.rs"), ("main", "main.rs")] {
        let krate = read_crate(root, &src.join(file), &src);
        assert!(
            krate.modules.len() > 1,
            "{file}: no modules found: the scan is broken"
        );
        circles.extend(krate.circles());
    }
    assert!(
        circles.is_empty(),
        "sibling modules in a circle (break it: move the shared item to the lower module or a \
         new one both use):\n{}",
        circles.join("\n")
    );
}

/// The scan itself, on a room with two circles: one through a re-export and a `use` group,
/// one from an inline module (`super::super::`) and a glob import of the parent. A test
/// module's reference and paths in a comment and a string would each close one more, and are
/// left out.
#[test]
fn the_layering_scan_sees_circles_through_every_kind_of_path() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        (
            "lib.rs",
            "mod a; mod b; mod c; mod d; mod e; mod f;\npub use b::Shared;",
        ),
        ("a.rs", "use super::Shared;\nfn f() { crate::c::g(); }"),
        ("b.rs", "use super::{a, d};\npub struct Shared;"),
        (
            "c.rs",
            "pub fn g() {} // super::a::f\nconst S: &str = \"super::a::f\";",
        ),
        (
            "d.rs",
            "pub fn h() {}\n#[cfg(test)]\nmod tests { use crate::b::Shared; }",
        ),
        ("e.rs", "mod inner { fn k() { super::super::f::m(); } }"),
        ("f.rs", "use super::*;\nfn m() { let _ = e::X; }"),
    ];
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let krate = read_crate("crate", &dir.path().join("lib.rs"), dir.path());
    let circles = krate.circles();
    assert_eq!(circles.len(), 2, "{circles:#?}");
    assert!(circles[0].contains("crate: a, b"), "{}", circles[0]);
    assert!(circles[1].contains("crate: e, f"), "{}", circles[1]);
    assert!(circles[1].contains("e -> f"), "{}", circles[1]);
}

fn read_crate(root: &'static str, file: &Path, dir: &Path) -> Crate {
    let mut krate = Crate {
        root,
        modules: BTreeMap::new(),
    };
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    krate.add(Vec::new(), file, &without_tests(&blank(&text)), dir);
    krate
}

impl Crate {
    /// Adds the module at `path` whose (blanked) code is `code`, and its children: inline
    /// ones from `code`, the others from `dir`.
    fn add(&mut self, path: ModPath, file: &Path, code: &[char], dir: &Path) {
        let mut module = Module {
            file: file.to_owned(),
            code: Vec::new(),
            children: BTreeSet::new(),
            reexports: BTreeMap::new(),
        };
        let mut rest = Vec::with_capacity(code.len());
        let mut i = 0;
        while i < code.len() {
            let Some((name, after)) = word_at(code, i, "mod").and_then(|j| ident(code, j)) else {
                rest.push(code[i]);
                i += 1;
                continue;
            };
            let j = skip_ws(code, after);
            let mut child = path.clone();
            child.push(name.clone());
            match code.get(j) {
                Some(';') => {
                    let file = [
                        dir.join(format!("{name}.rs")),
                        dir.join(&name).join("mod.rs"),
                    ]
                    .into_iter()
                    .find(|f| f.exists())
                    .unwrap_or_else(|| panic!("{}: no file for `mod {name};`", file.display()));
                    let text = std::fs::read_to_string(&file).unwrap();
                    self.add(
                        child,
                        &file,
                        &without_tests(&blank(&text)),
                        &dir.join(&name),
                    );
                    module.children.insert(name);
                    i = j + 1;
                }
                Some('{') => {
                    let end = closing(code, j);
                    self.add(child, file, &code[j + 1..end], &dir.join(&name));
                    module.children.insert(name);
                    i = end + 1;
                }
                _ => {
                    rest.push(code[i]);
                    i += 1;
                }
            }
        }
        for j in 0..rest.len() {
            let Some(start) = word_at(&rest, j, "use") else {
                continue;
            };
            let mut leaves = Vec::new();
            use_tree(&rest, start, Vec::new(), &mut leaves);
            for (mut segments, alias) in leaves {
                if segments.first().is_some_and(|s| s == "self") {
                    segments.remove(0);
                }
                let (Some(first), Some(last)) = (segments.first(), segments.last()) else {
                    continue;
                };
                if module.children.contains(first) && last != "*" {
                    let name = alias.unwrap_or_else(|| last.clone());
                    module.reexports.insert(name, first.clone());
                }
            }
        }
        module.code = rest;
        self.modules.insert(path, module);
    }

    /// Every room's circles, one line each: the room, the siblings in the circle, and for
    /// each reference among them one place that makes it.
    fn circles(&self) -> Vec<String> {
        // Room → sibling → sibling it refers to → where (first seen).
        let mut rooms: BTreeMap<ModPath, BTreeMap<String, BTreeMap<String, String>>> =
            BTreeMap::new();
        for (path, module) in &self.modules {
            for (target, shown) in self.references(path, module) {
                let common = path.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if common < path.len() && common < target.len() {
                    rooms
                        .entry(path[..common].to_vec())
                        .or_default()
                        .entry(path[common].clone())
                        .or_default()
                        .entry(target[common].clone())
                        .or_insert_with(|| {
                            let file = module.file.strip_prefix(env!("CARGO_MANIFEST_DIR"));
                            let file = file.unwrap_or(&module.file).display();
                            format!("{file}: {shown}")
                        });
                }
            }
        }
        let mut out = Vec::new();
        for (room, graph) in &rooms {
            for circle in strongly_connected(graph) {
                let edges: Vec<String> = circle
                    .iter()
                    .flat_map(|a| {
                        graph[a]
                            .iter()
                            .filter(|(b, _)| circle.contains(*b))
                            .map(move |(b, at)| format!("{a} -> {b} ({at})"))
                    })
                    .collect();
                let members: Vec<&str> = circle.iter().map(String::as_str).collect();
                out.push(format!(
                    "  {}: {}\n    {}",
                    [self.root.to_owned()]
                        .into_iter()
                        .chain(room.iter().cloned())
                        .collect::<Vec<_>>()
                        .join("::"),
                    members.join(", "),
                    edges.join("\n    ")
                ));
            }
        }
        out
    }

    /// The modules `module` (at `path`) refers to by a path, each with the path as written.
    fn references(&self, path: &ModPath, module: &Module) -> Vec<(ModPath, String)> {
        let code = &module.code;
        let mut out = Vec::new();
        let mut i = 0;
        while i < code.len() {
            let starts = (i == 0 || code[i - 1] != ':')
                && ["crate", "super"]
                    .into_iter()
                    .any(|w| word_at(code, i, w).is_some_and(|j| is_path(code, j)));
            if !starts {
                i += 1;
                continue;
            }
            let mut leaves = Vec::new();
            let end = use_tree(code, i, Vec::new(), &mut leaves);
            for (segments, _) in leaves {
                let shown = segments.join("::");
                let Some((target, glob)) = self.resolve(path, &segments) else {
                    continue;
                };
                if glob && path.starts_with(&target) && target.len() < path.len() {
                    // A glob import of an ancestor: what of its children is then written bare.
                    let room = &self.modules[&target];
                    for (j, name) in idents(code) {
                        let child = if room.children.contains(&name) && is_path(code, j) {
                            Some(name.clone())
                        } else {
                            room.reexports.get(&name).cloned()
                        };
                        if let Some(child) = child {
                            let mut t = target.clone();
                            t.push(child);
                            out.push((t, format!("{shown}, then {name}")));
                        }
                    }
                } else {
                    out.push((target, shown));
                }
            }
            i = end.max(i + 1);
        }
        out
    }

    /// The module a path written in the module at `from` leads into, and whether it ends in
    /// a glob; `None` for a path that is not `crate::` or `super::`.
    fn resolve(&self, from: &ModPath, segments: &[String]) -> Option<(ModPath, bool)> {
        let mut rest = segments.iter().peekable();
        let mut at = match rest.next()?.as_str() {
            "crate" => Vec::new(),
            "super" => from[..from.len().checked_sub(1)?].to_vec(),
            _ => return None,
        };
        while rest.peek().is_some_and(|s| *s == "super") {
            rest.next();
            at.pop();
        }
        for segment in rest {
            if segment == "*" {
                return Some((at, true));
            }
            if segment == "self" {
                continue;
            }
            let module = self.modules.get(&at)?;
            if let Some(child) = module
                .children
                .get(segment)
                .or_else(|| module.reexports.get(segment))
            {
                at.push(child.clone());
            } else {
                break;
            }
        }
        Some((at, false))
    }
}

/// The strongly connected components of two or more nodes (Tarjan's algorithm), each sorted.
fn strongly_connected(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        for w in s.graph.get(v).into_iter().flat_map(BTreeMap::keys) {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let low = s.low[v].min(s.low[w.as_str()]);
                s.low.insert(v, low);
            } else if s.stack.contains(&w.as_str()) {
                let low = s.low[v].min(s.index[w.as_str()]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let at = s.stack.iter().rposition(|x| *x == v).unwrap();
            let mut component: Vec<String> = s.stack.drain(at..).map(str::to_owned).collect();
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v.as_str()) {
            visit(&mut state, v);
        }
    }
    state.out.sort();
    state.out
}

/// Parses the use tree (or path) at `code[i..]` under `prefix`, pushing each leaf's segments
/// and alias to `out`; returns where it ends.
fn use_tree(
    code: &[char],
    i: usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let mut i = skip_ws(code, i);
    let mut segments = prefix;
    loop {
        match code.get(i) {
            Some('{') => {
                i += 1;
                loop {
                    i = skip_ws(code, i);
                    match code.get(i) {
                        None => return i,
                        Some('}') => return i + 1,
                        Some(',') => i += 1,
                        Some(_) => {
                            let end = use_tree(code, i, segments.clone(), out);
                            if end == i {
                                return i;
                            }
                            i = end;
                        }
                    }
                }
            }
            Some('*') => {
                segments.push("*".to_owned());
                out.push((segments, None));
                return i + 1;
            }
            _ => {}
        }
        let Some((name, after)) = ident(code, i) else {
            if !segments.is_empty() {
                out.push((segments, None));
            }
            return i;
        };
        segments.push(name);
        i = skip_ws(code, after);
        if code[i..].starts_with(&[':', ':']) {
            i = skip_ws(code, i + 2);
            continue;
        }
        let alias = word_at(code, i, "as").and_then(|j| ident(code, j));
        if let Some((_, after)) = &alias {
            i = *after;
        }
        out.push((segments, alias.map(|(a, _)| a)));
        return i;
    }
}

/// Whether `code[i..]` continues a path (`::`, after white space).
fn is_path(code: &[char], i: usize) -> bool {
    code[skip_ws(code, i)..].starts_with(&[':', ':'])
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn skip_ws(code: &[char], mut i: usize) -> usize {
    while code.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    i
}

/// The identifier at `code[i..]` (after white space) and where it ends.
fn ident(code: &[char], i: usize) -> Option<(String, usize)> {
    let i = skip_ws(code, i);
    let end = i + code[i..].iter().take_while(|c| is_ident_char(**c)).count();
    let first = code.get(i)?;
    (end > i && !first.is_ascii_digit()).then(|| (code[i..end].iter().collect(), end))
}

/// Every identifier in `code`, with where it ends.
fn idents(code: &[char]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if is_ident_char(code[i]) && (i == 0 || !is_ident_char(code[i - 1])) {
            let (name, end) = ident(code, i).unwrap_or_default();
            let end = end.max(i + 1);
            out.push((end, name));
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// Where the keyword `word` at `code[i]` ends (followed by white space or a path), if it is
/// there as a whole word.
fn word_at(code: &[char], i: usize, word: &str) -> Option<usize> {
    let end = i + word.chars().count();
    let here = code.get(i..end)?.iter().copied().eq(word.chars());
    let before = i == 0 || !is_ident_char(code[i - 1]);
    let after = code.get(end).is_none_or(|c| !is_ident_char(*c));
    (here && before && after).then_some(end)
}

/// The index of the `}` (or `]`, `)`) closing the bracket at `code[open]`.
fn closing(code: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, c) in code.iter().enumerate().skip(open) {
        match c {
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// `code` without the items under `#[cfg(test)]` (each up to its `;` or its closing brace).
fn without_tests(code: &[char]) -> Vec<char> {
    const ATTR: &str = "#[cfg(test)]";
    let attr: Vec<char> = ATTR.chars().collect();
    let mut out = Vec::with_capacity(code.len());
    let mut i = 0;
    while i < code.len() {
        if !code[i..].starts_with(&attr) {
            out.push(code[i]);
            i += 1;
            continue;
        }
        i += attr.len();
        // Further attributes, then the item up to a `;` or a block at its own level.
        loop {
            i = skip_ws(code, i);
            match code.get(i) {
                Some('#') => i = closing(code, i + 1) + 1,
                Some(';') => {
                    i += 1;
                    break;
                }
                Some('{') => {
                    i = closing(code, i) + 1;
                    break;
                }
                Some('(' | '[') => i = closing(code, i) + 1,
                Some(_) => i += 1,
                None => break,
            }
        }
        out.push(' ');
    }
    out
}

/// `text` with comments left out and string and character literals emptied, so that only
/// code is scanned.
fn blank(text: &str) -> Vec<char> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::with_capacity(c.len());
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        // An identifier's end, but for the `b` of `br"…"`.
        let after_ident = i > 0
            && is_ident_char(c[i - 1])
            && !(c[i - 1] == 'b' && (i == 1 || !is_ident_char(c[i - 2])));
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0usize;
            while i < c.len() {
                if c[i..].starts_with(&['/', '*']) {
                    depth += 1;
                    i += 2;
                } else if c[i..].starts_with(&['*', '/']) {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == 'r' && !after_ident && matches!(next, Some('"' | '#')) {
            let hashes = c[i + 1..].iter().take_while(|x| **x == '#').count();
            if c.get(i + 1 + hashes) != Some(&'"') {
                // A raw identifier (`r#type`).
                out.push(c[i]);
                i += 1;
                continue;
            }
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            i += 2 + hashes;
            while i < c.len() && !c[i..].starts_with(&close) {
                i += 1;
            }
            i += close.len();
            out.extend(['"', '"']);
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.extend(['"', '"']);
        } else if c[i] == '\'' && next == Some('\\') {
            i += 3;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.extend(['\'', '\'']);
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            i += 3;
            out.extend(['\'', '\'']);
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}
