//! The API a model reads: the `rhai` and `text` renderings of a catalog, compared with checked-in
//! snapshots in `tests/snapshots/`. `UPDATE_SNAPSHOTS=1 cargo test --test it api` rewrites them.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use toolscript::{Effect, Format, Registry, Runtime, Tool, ToolSpec};

/// Compares `actual` with the snapshot `name`, or writes it when `UPDATE_SNAPSHOTS` is set.
fn snapshot(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "no snapshot at {} ({e}): run with UPDATE_SNAPSHOTS=1",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{name} differs from its snapshot (UPDATE_SNAPSHOTS=1 rewrites it):\n{}",
        first_difference(&expected, actual)
    );
}

fn first_difference(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    for i in 0..e.len().max(a.len()) {
        if e.get(i) != a.get(i) {
            return format!(
                "line {}:\n  expected: {:?}\n  actual:   {:?}",
                i + 1,
                e.get(i),
                a.get(i)
            );
        }
    }
    String::new()
}

/// The o200k tokens of `text`, as a model counts them.
fn tokens(text: &str) -> usize {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len()
}

#[derive(Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum State {
    Open,
    Closed,
}

/// A label on an issue.
#[derive(Deserialize, Serialize, JsonSchema)]
struct Label {
    id: u64,
    name: String,
}

/// One page of results.
#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Page {
    /// Issues per page.
    #[schemars(range(min = 1, max = 100))]
    size: u32,
    /// Where the previous page ended.
    cursor: Option<String>,
}

/// The arguments of `list_issues`.
#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct ListIssues {
    /// The repository, as owner/name.
    repo: String,
    /// Only issues in this state.
    state: Option<State>,
    page: Option<Page>,
    #[serde(default)]
    labels: Vec<String>,
}

#[derive(Serialize, JsonSchema)]
struct Issue {
    number: u64,
    title: String,
    state: State,
    labels: Vec<Label>,
    /// Who it is assigned to.
    assignee: Option<String>,
}

/// A catalog with every kind of type the renderer knows: a typed tool (schemars' `Option<Enum>`,
/// nested structs, `Vec<Struct>`, `$defs`), hand-written schemas with a recursive `$ref`,
/// nullable and constant values, defaults, formats, ranges, maps, `allOf`, a tool without an
/// output schema and an MCP tool without one.
fn catalog() -> Registry {
    let list_issues = Tool::builder("list_issues", Effect::Read)
        .description("Issues of a repository, newest first.")
        .typed(|_: ListIssues| async { Ok(Vec::<Issue>::new()) });
    let tree = Tool::builder("get_tree", Effect::Read)
        .description("A folder and everything under it.")
        .input_schema(json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "relative to the root", "default": "."},
                "depth": {"type": ["integer", "null"], "minimum": 1, "maximum": 10}
            },
            "required": [],
            "additionalProperties": false
        }))
        .output_schema(json!({
            "$ref": "#/$defs/Entry",
            "$defs": {
                "Entry": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"enum": ["file", "dir"]},
                        "modified": {"type": "string", "format": "date-time"},
                        "size": {"type": ["integer", "null"], "description": "bytes; () for a folder"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/Entry"}}
                    },
                    "required": ["name", "kind", "modified", "size"]
                }
            }
        }))
        .handler(|_| async { Ok(Value::Null) });
    let tag = Tool::builder("tag_release", Effect::Idempotent)
        .description("Tags a release.")
        .input_schema(json!({
            "allOf": [
                {"$ref": "#/definitions/Target"},
                {"type": "object", "properties": {
                    "version": {"type": "string", "pattern": "^v[0-9]+\\.[0-9]+\\.[0-9]+$"},
                    "notes": {"type": "string", "maxLength": 2000}
                }, "required": ["version"]}
            ],
            "definitions": {
                "Target": {"type": "object", "properties": {
                    "repo": {"type": "string"},
                    "commit": {"type": "string", "minLength": 40, "maxLength": 40,
                               "description": "the full SHA-1"}
                }, "required": ["repo", "commit"]}
            }
        }))
        .output_schema(json!({
            "type": "object",
            "properties": {
                "tag": {"type": "string"},
                "created": {"type": "boolean", "description": "false when the tag was there already"},
                "assets": {"type": "object", "additionalProperties": {"type": "string", "format": "uri"}},
                "kind": {"const": "release"}
            },
            "required": ["tag", "created", "assets", "kind"]
        }))
        .handler(|_| async { Ok(Value::Null) });
    let notify = Tool::builder("notify", Effect::External)
        .description("Posts a message to a channel.")
        .input_schema(json!({
            "type": "object",
            "properties": {
                "channel": {"oneOf": [
                    {"const": "ops", "description": "the on-call engineers"},
                    {"const": "all", "description": "everyone"}
                ]},
                "text": {"type": "string", "minLength": 1},
                "urgency": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
            },
            "required": ["channel", "text"]
        }))
        .handler(|_| async { Ok(Value::Null) });
    let mut search = ToolSpec::new("web-search", Effect::Read);
    search.description = "Searches the web.".into();
    search.input_schema = json!({
        "type": "object",
        "properties": {"q": {"type": "string"}, "limit": {"type": "integer", "default": 10}},
        "required": ["q"]
    });
    search.origin = Some("mcp:web/web-search".into());
    let search = Tool::from_spec(search, |_, _| async { Ok(Value::Null) });
    Registry::builder()
        .tools([list_issues, tree, tag, notify, search])
        .build()
        .expect("the catalog builds")
}

#[test]
fn a_catalog_of_every_kind_of_type_reads_as_its_snapshot() {
    let runtime = Runtime::new(catalog());
    snapshot("catalog.rhai.txt", &runtime.describe(Format::Rhai));
    snapshot("catalog.text.txt", &runtime.describe(Format::Text));
}

#[test]
fn the_demo_catalog_reads_as_its_snapshot() {
    let runtime = Runtime::new(toolscript::demo_catalog().unwrap());
    snapshot("demo.rhai.txt", &runtime.describe(Format::Rhai));
}

/// Every tool of the demo catalog declares its result: no `?` is left in its API.
#[test]
fn the_demo_api_is_fully_typed_and_within_its_token_budget() {
    let api = Runtime::new(toolscript::demo_catalog().unwrap()).describe(Format::Rhai);
    let signatures: Vec<&str> = api.lines().filter(|l| !l.starts_with("//")).collect();
    assert!(
        signatures
            .iter()
            .all(|l| !l.contains('?') || l.contains("?:")),
        "{api}"
    );
    // 1,329 tokens when this was written; a rendering that grows it by a quarter is a
    // regression of what every prompt pays.
    let n = tokens(&api);
    assert!(n <= 1_660, "the demo API is {n} tokens");
}

/// What the crib sheet heading the `rhai` API says about Rhai is what the engine does: the
/// examples it gives run as it says, and a script function does not see the script's
/// variables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crib_sheet_says_what_the_engine_does() {
    let runtime = Runtime::new(toolscript::demo_catalog().unwrap());
    let script = r#"
        let arr = [#{ ok: true, id: 1 }, #{ ok: false, id: 2 }];
        let m = #{ a: 1 };
        let n = 3;
        fn f() { get_customer(#{ id: 999 }) }
        let r = ();
        try { r = f(); } catch (e) { r = e; }
        arr.push(#{ ok: true, id: 3 });
        #{
            interpolated: `id ${n}`, plain: "id ${n}", missing: m.zzz, fallback: m.zzz ?? 7,
            ids: arr.filter(|x| x.ok).map(|x| x.id), keys: m.keys(), has: "a" in m,
            len: arr.len(), kind: r.kind, recoverable: r.recoverable, tool: r.tool,
            error_fields: r.keys(),
        }
    "#;
    let outcome = runtime.run(script).await;
    let value = crate::support::value_of(&outcome);
    assert_eq!(
        value,
        &json!({
            "interpolated": "id 3", "plain": "id ${n}", "missing": null, "fallback": 7,
            "ids": [1, 3], "keys": ["a"], "has": true, "len": 3,
            "kind": "not_found", "recoverable": false, "tool": "get_customer",
            "error_fields": ["column", "kind", "line", "message", "recoverable", "suggested_next_action", "tool"],
        })
    );
    for (script, kind) in [
        ("let y = 1;\nfn g() { y }\ng()", "script_error"),
        ("let m = { a: 1 };\nm", "invalid_script"),
        ("let x = null;\nx", "invalid_script"),
        ("let x = try { 1 } catch (e) { 2 };\nx", "invalid_script"),
    ] {
        let outcome = runtime.run(script).await;
        assert_eq!(
            crate::support::error_of(&outcome).kind_name(),
            kind,
            "{script}"
        );
    }
}

/// An MCP server whose tools answer in each of the ways a result can come: one text item, a
/// text item that is JSON, several items, structured content with an output schema, and
/// structured content without one.
const RESULTS_SERVER: &str = r#"
const readline = require('readline');
const object = { type: 'object' };
const tools = [
  { name: 'plain', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'json', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'items', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'typed', inputSchema: object, annotations: { readOnlyHint: true },
    outputSchema: { type: 'object', properties: { n: { type: 'integer', description: 'a count' } },
                    required: ['n'] } },
  { name: 'untyped', inputSchema: object, annotations: { readOnlyHint: true } },
];
const send = (m) => process.stdout.write(JSON.stringify({ jsonrpc: '2.0', ...m }) + '\n');
const text = (t) => ({ type: 'text', text: t });
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  let m;
  try { m = JSON.parse(line); } catch { return; }
  const { id, method, params } = m;
  if (id === undefined) return;
  if (method === 'initialize') {
    return send({ id, result: { protocolVersion: '2025-06-18', capabilities: { tools: {} },
      serverInfo: { name: 'results', version: '1.0.0' } } });
  }
  if (method === 'tools/list') return send({ id, result: { tools } });
  if (method === 'tools/call') {
    switch (params.name) {
      case 'plain': return send({ id, result: { content: [text('hello')] } });
      case 'json': return send({ id, result: { content: [text('{"n": 1}')] } });
      case 'items': return send({ id, result: { content: [text('a'), text('b')] } });
      case 'typed': return send({ id, result: { content: [text('{"n": 2}')], structuredContent: { n: 2 } } });
      case 'untyped': return send({ id, result: { content: [text('x')], structuredContent: { a: 1 } } });
    }
  }
  send({ id, error: { code: -32601, message: 'Method not found' } });
}).on('close', () => process.exit(0));
"#;

/// What the API says an MCP tool returns is what a script gets: `text` (explained once) for
/// a tool without an output schema, the declared type for one with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_tool_s_result_is_what_the_api_says() {
    if !crate::support::node_available() {
        return;
    }
    let dir = tempfile::TempDir::new().unwrap();
    let server = dir.path().join("results_server.js");
    std::fs::write(&server, RESULTS_SERVER).unwrap();
    let manifest = format!(
        "[[mcp]]\nname = \"results\"\ncommand = [\"node\", {}]\n",
        serde_json::to_string(&server.to_string_lossy()).unwrap()
    );
    let mut manifests = toolscript::Manifests::new();
    manifests
        .load_str(&dir.path().join("results.toml"), &manifest)
        .unwrap();
    let runtime = Runtime::new(manifests.build().await.unwrap());
    let api = runtime.describe(Format::Rhai);
    for signature in [
        "fn plain() -> text;",
        "fn json() -> text;",
        "fn items() -> text;",
        "fn typed() -> #{\n    n: int,  // a count\n};",
        "fn untyped() -> text;",
    ] {
        assert!(api.contains(signature), "{signature}\n{api}");
    }
    assert!(
        api.contains("// `text`: an MCP tool's undeclared result"),
        "{api}"
    );
    let outcome = runtime
        .run(
            "#{ plain: plain(), plain_type: type_of(plain()), json: json(), items: items(), \
             typed: typed(), untyped: untyped() }",
        )
        .await;
    assert_eq!(
        crate::support::value_of(&outcome),
        &json!({
            "plain": "hello", "plain_type": "string", "json": {"n": 1},
            "items": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "typed": {"n": 2}, "untyped": {"a": 1},
        })
    );
}
