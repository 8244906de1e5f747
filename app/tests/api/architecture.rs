//! The shape of `app/src`: its top-level modules import one another without a circle, so each
//! can be read (and taught) from the ones below it, and so do the engine's own files. `lib.rs`
//! lists the layers; a `crate::x` path in a module's code (not its comments, not its tests) is an
//! import of `x`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// No import circle among app/src's top-level modules.
#[test]
fn the_top_level_modules_import_without_a_circle() {
    let graph = import_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert_no_circle(&graph, "app/src's top-level modules", 20, ("app", "http"));
}

/// The engine's files (`app/src/idempotency/`) import one another without a circle either
/// (`claim` ⇄ `operation` was one: the claim runs the operation's first write, and submitting
/// claimed). A name reached through `super::` or `crate::idempotency::` is an import of the file
/// that defines it, through `mod.rs`'s re-exports.
#[test]
fn the_engine_files_import_without_a_circle() {
    let graph = sibling_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/idempotency"));
    assert_no_circle(&graph, "the engine's files", 10, ("claim", "lease"));
}

/// `graph` has more than `least` nodes, the `known` import among them (so the parser still sees
/// imports), and no circle.
fn assert_no_circle(graph: &Graph, what: &str, least: usize, known: (&str, &str)) {
    assert!(graph.len() > least, "{what} were not found: {graph:?}");
    assert!(graph[known.0].contains(known.1), "the parser no longer sees imports: {:?}", graph[known.0]);
    let circles = circles(graph);
    assert!(circles.is_empty(), "import circles among {what}: {circles:?}\n{graph:#?}");
}

/// The check can fail: a graph with a circle is reported, one without is not.
#[test]
fn a_circle_is_found() {
    let graph = |edges: &[(&str, &str)]| {
        let mut graph = Graph::new();
        for (from, to) in edges {
            graph.entry((*from).into()).or_default().insert((*to).into());
            graph.entry((*to).into()).or_default();
        }
        graph
    };
    let found = circles(&graph(&[("http", "state"), ("state", "web"), ("web", "http"), ("app", "http")]));
    assert_eq!(found, vec![BTreeSet::from(["http".into(), "state".into(), "web".into()])]);
    assert!(circles(&graph(&[("app", "http"), ("http", "state"), ("app", "state")])).is_empty());
}

/// Each top-level module of `src` and the top-level modules its code names.
fn import_graph(src: &Path) -> Graph {
    let modules: BTreeSet<String> = std::fs::read_dir(src)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_stem()?.to_str()?.to_owned();
            (path.is_dir() || path.extension()? == "rs").then_some(name)
        })
        .filter(|name| name != "lib" && name != "main")
        .collect();
    let mut graph = Graph::new();
    for module in &modules {
        let mut files = Vec::new();
        let dir = src.join(module);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        }
        files.push(src.join(format!("{module}.rs")));
        let imports = graph.entry(module.clone()).or_default();
        let test_files = test_files(&files);
        for file in files.iter().filter(|file| file.exists() && !test_files.iter().any(|t| file.starts_with(t))) {
            let code = without_tests(&without_comments(&std::fs::read_to_string(file).unwrap()));
            imports.extend(
                named_after(&code, "crate::").into_iter().filter(|name| modules.contains(name) && name != module),
            );
        }
    }
    graph
}

/// Each file of the module `dir` (but its `mod.rs`) and the sibling files its code names.
fn sibling_graph(dir: &Path) -> Graph {
    let code = |file: &Path| without_tests(&without_comments(&std::fs::read_to_string(file).unwrap()));
    let files: BTreeMap<String, PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .map(|path| (path.file_stem().unwrap().to_str().unwrap().to_owned(), path))
        .filter(|(name, _)| name != "mod")
        .collect();
    // `pub use file::{A, B};` in mod.rs: A and B are file's.
    let mut exported = BTreeMap::new();
    for statement in code(&dir.join("mod.rs")).split(';') {
        if let Some(path) = statement.trim().strip_prefix("pub use ")
            && let Some((file, items)) = path.split_once("::")
            && files.contains_key(file)
        {
            for item in items.trim_matches(|c| c == '{' || c == '}').split(',') {
                exported.insert(item.trim().to_owned(), file.to_owned());
            }
        }
    }
    let prefix = format!("crate::{}::", dir.file_name().unwrap().to_str().unwrap());
    let mut graph = Graph::new();
    for (name, path) in &files {
        let code = code(path);
        let imports = graph.entry(name.clone()).or_default();
        for named in named_after(&code, "super::").into_iter().chain(named_after(&code, &prefix)) {
            let file = if files.contains_key(&named) { Some(named) } else { exported.get(&named).cloned() };
            imports.extend(file.filter(|file| file != name));
        }
    }
    graph
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// The files and folders of the modules declared `#[cfg(test)] mod name;`.
fn test_files(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut tests = Vec::new();
    for file in files.iter().filter(|file| file.exists()) {
        let code = std::fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = code.lines().map(str::trim).collect();
        for pair in lines.windows(2) {
            let declared = pair[1].strip_prefix("mod ").and_then(|rest| rest.strip_suffix(';'));
            if let (true, Some(name)) = (pair[0] == "#[cfg(test)]", declared) {
                // `x.rs` or `x/mod.rs` declares `x/name.rs` or `x/name/`.
                let parent = match file.file_stem().and_then(|stem| stem.to_str()) {
                    Some("mod") => file.parent().unwrap().to_path_buf(),
                    Some(stem) => file.parent().unwrap().join(stem),
                    None => continue,
                };
                tests.push(parent.join(format!("{name}.rs")));
                tests.push(parent.join(name));
            }
        }
    }
    tests
}

/// `code` without its `//` comments (doc comments name modules they do not import).
fn without_comments(code: &str) -> String {
    code.lines().map(|line| line.split_once("//").map_or(line, |(code, _)| code)).collect::<Vec<_>>().join("\n")
}

/// `code` without its `#[cfg(test)] mod … { … }` blocks.
fn without_tests(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let Some(open) = after.find('{').filter(|open| !after[..*open].contains(';')) else {
            rest = &after["#[cfg(test)]".len()..];
            continue;
        };
        let mut depth = 0;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = open + i + 1;
                break;
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The names `code` reaches through `prefix` (`crate::`, say): `crate::a::…` and
/// `crate::{a, b::…}`.
fn named_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let word = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            // Top-level entries only: what follows `{` or a comma outside nested braces.
            let mut depth = 0;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        names.insert(word(&group[i..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(word(rest));
        }
    }
    names
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn circles(graph: &Graph) -> Vec<BTreeSet<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in &self.graph[v] {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w.as_str()]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w.as_str()) {
                    let low = self.low[v].min(self.index[w.as_str()]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    component.insert(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// docs/architecture.md's recipe is the code: each of its Rust blocks names a file on its first
/// line (`// app/src/…`) and is that file's lines, in order and contiguous, but where a `// …`
/// line leaves some out (leading whitespace aside).
#[test]
fn the_recipe_is_quoted_from_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let blocks: Vec<&str> =
        doc.split("```rust\n").skip(1).map(|rest| &rest[..rest.find("```").expect("a closed block")]).collect();
    assert!(blocks.len() >= 6, "the recipe's blocks: {}", blocks.len());
    for block in blocks {
        let mut lines = block.lines();
        let file = lines.next().and_then(|first| first.strip_prefix("// ")).expect("a block names its file");
        let code = std::fs::read_to_string(root.join(file)).unwrap_or_else(|_| panic!("{file} exists"));
        let code: Vec<&str> = code.lines().map(str::trim).collect();
        let quoted: Vec<&str> = lines.map(str::trim).collect();
        assert!(quoted_in(&quoted, &code), "docs/architecture.md quotes {file} wrongly:\n{block}");
    }
    // The check fails on a line that is not there, or out of order.
    let code = ["a", "b", "c", "d"];
    assert!(quoted_in(&["a", "b", "// …", "d"], &code) && quoted_in(&["b", "c"], &code));
    assert!(!quoted_in(&["a", "c"], &code) && !quoted_in(&["c", "// …", "a"], &code));
}

/// Whether `quoted` is a run of `code`'s lines, with `// …` standing for any lines.
fn quoted_in(quoted: &[&str], code: &[&str]) -> bool {
    let parts: Vec<&[&str]> = quoted.split(|line| *line == "// …").collect();
    (0..code.len()).any(|start| {
        let mut at = start;
        parts.iter().enumerate().all(|(i, part)| {
            let found = if i == 0 {
                code[at..].starts_with(part).then_some(at)
            } else {
                (at..=code.len()).find(|from| code[*from..].starts_with(part))
            };
            found.map(|from| at = from + part.len()).is_some()
        })
    })
}
