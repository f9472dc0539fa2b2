//! Typed and untyped tools side by side.
//!
//! `get_user` and `send_email` are typed: their arguments and results are Rust structs, and their
//! JSON Schemas come from `schemars`. `convert` is untyped: a body over JSON values with a
//! hand-written input schema. A script calls all three, catches the errors it expects (a user
//! that does not exist, arguments that break a schema) and returns a summary; the program prints
//! the value, the captured logs, the effects and the stats of the run.
//!
//! Run with `cargo run --example typed_tools`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use toolscript::{Effect, Format, Registry, Runtime, Tool, ToolError};

/// The arguments of `get_user`.
#[derive(Debug, Deserialize, JsonSchema)]
struct GetUser {
    /// The user's numeric id.
    id: u64,
}

/// What `get_user` returns.
#[derive(Debug, Serialize, JsonSchema)]
struct User {
    id: u64,
    name: String,
    email: String,
}

/// The arguments of `send_email`.
#[derive(Debug, Deserialize, JsonSchema)]
struct SendEmail {
    /// The recipient's address.
    to: String,
    /// The subject line.
    subject: String,
}

/// What `send_email` returns.
#[derive(Debug, Serialize, JsonSchema)]
struct Sent {
    /// The id the mail system gave the message.
    message_id: String,
}

/// The users `get_user` knows about.
const USERS: &[(u64, &str, &str)] = &[
    (1, "Ada", "ada@example.com"),
    (2, "Grace", "grace@example.com"),
];

/// The script a model might have written: look a user up, convert a price, mail the result, and
/// carry on past the failures it anticipates.
const SCRIPT: &str = r#"
let user = get_user(#{id: 1});
print(`found ${user.name} <${user.email}>`);

// A user that does not exist: the tool's `not_found` is caught, and the script carries on.
let missing = "none";
try {
    get_user(#{id: 99});
} catch (e) {
    missing = e.kind;
    print(`lookup failed: ${e.kind}: ${e.message}`);
}

// Arguments that break the untyped tool's schema are refused before its body runs.
let refused = "none";
try {
    convert(#{amount: "ten", currency: "EUR"});
} catch (e) {
    refused = e.kind;
    print(`convert refused: ${e.kind}`);
}

let price = convert(#{amount: 120.0, currency: "EUR"});
let sent = send_email(#{to: user.email, subject: `Your quote: ${price.amount} ${price.currency}`});
print(`sent ${sent.message_id}`);

#{
    user: user.name,
    missing: missing,
    refused: refused,
    price: price,
    message_id: sent.message_id,
}
"#;

fn registry() -> Result<Registry, toolscript::Error> {
    let get_user = Tool::builder("get_user", Effect::Read)
        .description("Looks a user up by id.")
        .typed(|args: GetUser| async move {
            USERS
                .iter()
                .find(|(id, _, _)| *id == args.id)
                .map(|&(id, name, email)| User {
                    id,
                    name: name.to_string(),
                    email: email.to_string(),
                })
                .ok_or_else(|| ToolError::not_found(format!("no user has id {}", args.id)))
        });

    let send_email = Tool::builder("send_email", Effect::Write)
        .description("Sends an email; every call sends one.")
        .typed(|args: SendEmail| async move {
            Ok(Sent {
                message_id: format!("msg-{}-{}", args.to.len(), args.subject.len()),
            })
        });

    let convert = Tool::builder("convert", Effect::Read)
        .description("Converts an amount into US dollars.")
        .input_schema(json!({
            "type": "object",
            "properties": {
                "amount": {"type": "number", "minimum": 0},
                "currency": {"enum": ["EUR", "GBP", "USD"]}
            },
            "required": ["amount", "currency"],
            "additionalProperties": false
        }))
        .output_schema(json!({
            "type": "object",
            "properties": {
                "amount": {"type": "number"},
                "currency": {"const": "USD"}
            },
            "required": ["amount", "currency"]
        }))
        .handler(|args: Value| async move {
            // The input schema has been checked, so both fields are there and well typed.
            let amount = args["amount"].as_f64().unwrap_or_default();
            let rate = match args["currency"].as_str() {
                Some("EUR") => 1.25,
                Some("GBP") => 1.5,
                _ => 1.0,
            };
            Ok(json!({"amount": amount * rate, "currency": "USD"}))
        });

    Registry::builder()
        .tools([get_user, send_email, convert])
        .build()
}

#[tokio::main]
async fn main() -> Result<(), toolscript::Error> {
    let runtime = Runtime::new(registry()?);
    println!("== tools, as a model reads them ==");
    print!("{}", runtime.describe(Format::Text));

    let outcome = runtime.run(SCRIPT).await;

    println!("== value ==");
    match &outcome.result {
        Ok(value) => println!("{}", pretty(value)),
        Err(e) => println!("the run failed: {e}"),
    }
    println!("== logs ==");
    for line in &outcome.logs {
        println!("{line}");
    }
    println!("== effects ==");
    for effect in &outcome.effects {
        println!(
            "{} ({}) ok={} args={}",
            effect.tool,
            effect.effect,
            effect.ok.map_or("unknown".to_string(), |ok| ok.to_string()),
            effect.args
        );
    }
    println!("== stats ==");
    println!("{}", pretty(&json!(outcome.stats)));
    println!("({} receipts)", outcome.receipts.len());

    if outcome.result.is_err() {
        std::process::exit(1);
    }
    Ok(())
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}
