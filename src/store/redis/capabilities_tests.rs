//! The probe's decision, for servers at hand and not (Redis 8.4's `DELEX`, Valkey 9's
//! `DELIFEQ`, Dragonfly, Garnet, a managed server that renamed commands away).

use super::*;

fn hello(server: &str, version: &str) -> Option<Vec<(String, String)>> {
    Some(vec![
        ("server".to_owned(), server.to_owned()),
        ("version".to_owned(), version.to_owned()),
        ("proto".to_owned(), "2".to_owned()),
    ])
}

/// Answers of a server with everything listed but the commands in `missing`.
fn answers(server: &str, version: &str, info: &str, missing: &[&str]) -> Answers {
    Answers {
        hello: hello(server, version),
        info: Some(info.to_owned()),
        commands: Some(COMMANDS.iter().map(|c| !missing.contains(c)).collect()),
        set_ifeq_documented: false,
        lua: true,
        config_get: true,
        busy: None,
        error_code: None,
    }
}

#[test]
fn redis_7_renews_and_releases_by_script() {
    let caps = decide(&answers(
        "redis",
        "7.0.15",
        "# Server\r\nredis_version:7.0.15\r\n",
        &["delex", "delifeq"],
    ))
    .unwrap();
    assert_eq!(caps.server, ServerKind::Redis);
    assert_eq!(caps.version, "7.0.15");
    assert!(caps.lua && caps.resp3 && caps.tracking_bcast && caps.sharded_pubsub);
    assert_eq!(caps.renewal(), LockWrite::Script);
    assert_eq!(caps.release(), LockWrite::Script);
}

#[test]
fn redis_8_4_has_set_ifeq_and_delex() {
    let caps = decide(&answers(
        "redis",
        "8.4.0",
        "redis_version:8.4.0\r\n",
        &["delifeq"],
    ))
    .unwrap();
    assert_eq!(caps.renewal(), LockWrite::SetIfEq);
    assert_eq!(caps.release(), LockWrite::DelEx);
    assert!(caps.fallbacks().is_empty(), "{:?}", caps.fallbacks());
}

#[test]
fn valkey_8_1_renews_by_ifeq_and_valkey_9_releases_by_delifeq() {
    let info = "redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n";
    let caps = decide(&answers("valkey", "8.1.1", info, &["delex", "delifeq"])).unwrap();
    assert_eq!(
        (caps.server, caps.version.as_str()),
        (ServerKind::Valkey, "8.1.1")
    );
    assert_eq!(caps.renewal(), LockWrite::SetIfEq);
    assert_eq!(caps.release(), LockWrite::Script);
    let info = "redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.0.0\r\n";
    let caps = decide(&answers("valkey", "9.0.0", info, &["delex"])).unwrap();
    assert_eq!(caps.release(), LockWrite::DelIfEq);
}

#[test]
fn the_docs_of_set_decide_ifeq_on_a_version_the_rule_does_not_know() {
    let mut found = answers(
        "redis",
        "8.2.3",
        "redis_version:8.2.3\r\n",
        &["delex", "delifeq"],
    );
    assert_eq!(decide(&found).unwrap().renewal(), LockWrite::Script);
    found.set_ifeq_documented = true;
    assert_eq!(decide(&found).unwrap().renewal(), LockWrite::SetIfEq);
}

#[test]
fn dragonfly_and_garnet_are_named_by_info_and_have_no_bcast() {
    let info = "redis_version:7.4.0\r\ndragonfly_version:df-v1.30.0\r\n";
    let caps = decide(&answers("redis", "7.4.0", info, &["delex", "delifeq"])).unwrap();
    assert_eq!(caps.server, ServerKind::Dragonfly);
    assert!(!caps.tracking_bcast);
    assert_eq!(caps.renewal(), LockWrite::Script);
    let mut garnet = answers(
        "redis",
        "7.2.5",
        "garnet_version:1.0.60\r\n",
        &["delex", "delifeq"],
    );
    garnet.lua = false;
    let caps = decide(&garnet).unwrap();
    assert_eq!(caps.server, ServerKind::Garnet);
    assert!(!caps.lua && !caps.tracking_bcast);
    assert!(lua_setting(caps.server).contains("--lua"));
}

#[test]
fn a_managed_server_without_client_and_config_falls_back() {
    let mut managed = answers(
        "redis",
        "7.0.15",
        "redis_version:7.0.15\r\n",
        &["client", "delex", "delifeq"],
    );
    managed.config_get = false;
    let caps = decide(&managed).unwrap();
    assert!(!caps.tracking_bcast && !caps.config_get && caps.lua);
    let lines = caps.fallbacks();
    assert!(lines.iter().any(|l| l.contains("TRACKING")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("CONFIG GET")), "{lines:?}");
}

#[test]
fn without_command_info_the_version_decides() {
    let mut refused = answers("redis", "8.4.1", "redis_version:8.4.1\r\n", &[]);
    refused.commands = None;
    let caps = decide(&refused).unwrap();
    assert_eq!(caps.renewal(), LockWrite::SetIfEq);
    // DELEX is never assumed: a release by script is always right.
    assert_eq!(caps.release(), LockWrite::Script);
}

#[test]
fn replies_that_are_not_redis_are_refused() {
    // An echo server sends the commands back: arrays of bulk strings, no version anywhere.
    let echoed = |words: &[&str]| {
        Value::Array(
            words
                .iter()
                .map(|w| Value::BulkString(w.as_bytes().to_vec()))
                .collect(),
        )
    };
    let replies = vec![
        echoed(&["HELLO"]),
        echoed(&["INFO", "server"]),
        echoed(&["COMMAND", "INFO"]),
        echoed(&["COMMAND", "DOCS", "set"]),
        echoed(&["EVAL", "return 1", "1", PROBE_KEY]),
        echoed(&["CONFIG", "GET", "maxmemory-policy"]),
    ];
    assert!(matches!(
        decide(&Answers::read(replies)),
        Err(ProbeError::NotRedis(_))
    ));
    assert!(matches!(
        decide(&Answers::default()),
        Err(ProbeError::NotRedis(_))
    ));
}

#[test]
fn replies_are_read_from_resp2_and_resp3_shapes() {
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let replies = vec![
        Value::Map(vec![
            (bulk("server"), bulk("redis")),
            (bulk("version"), bulk("7.0.15")),
            (bulk("proto"), Value::Int(3)),
        ]),
        Value::VerbatimString {
            format: redis::VerbatimFormat::Text,
            text: "redis_version:7.0.15\r\n".to_owned(),
        },
        Value::Array(vec![
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Nil,
            Value::Nil,
            Value::Array(vec![]),
        ]),
        Value::Map(vec![(
            bulk("set"),
            Value::Array(vec![bulk("token"), bulk("NX")]),
        )]),
        Value::Int(1),
        redis::parse_redis_value(b"-NOPERM no permission\r\n").unwrap(),
    ];
    let caps = decide(&Answers::read(replies)).unwrap();
    assert!(caps.lua && caps.resp3 && !caps.config_get && !caps.delex && !caps.set_ifeq);
}

#[test]
fn versions_are_read_leniently() {
    assert_eq!(version_triple("8.1.1"), (8, 1, 1));
    assert_eq!(version_triple("7.2"), (7, 2, 0));
    assert_eq!(version_triple("v1.30.0-rc"), (1, 30, 0));
    assert_eq!(version_triple(""), (0, 0, 0));
}

#[test]
fn a_user_confined_to_its_keys_runs_scripts_but_one_refused_eval_does_not() {
    let reply = |text: &str| redis::parse_redis_value(text.as_bytes()).unwrap();
    assert!(lua_ran(&Value::Int(1)));
    assert!(lua_ran(&reply(
        "-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"
    )));
    assert!(!lua_ran(&reply(
        "-NOPERM this user has no permissions to run the 'eval' command\r\n"
    )));
    assert!(!lua_ran(&reply("-ERR unknown command 'EVAL'\r\n")));
}

#[test]
fn a_loading_server_is_not_judged() {
    let reply = |text: &str| redis::parse_redis_value(text.as_bytes()).unwrap();
    let loading = || reply("-LOADING Redis is loading the dataset in memory\r\n");
    let replies = vec![
        loading(),
        loading(),
        loading(),
        loading(),
        loading(),
        loading(),
    ];
    assert!(
        matches!(decide(&Answers::read(replies)), Err(ProbeError::Unjudged(code)) if code == "LOADING")
    );
}

#[test]
fn a_server_that_refuses_this_login_is_redis_but_not_judged() {
    let noauth = || redis::parse_redis_value(b"-NOAUTH Authentication required.\r\n").unwrap();
    let replies = (0..6).map(|_| noauth()).collect();
    assert!(
        matches!(decide(&Answers::read(replies)), Err(ProbeError::Unjudged(code)) if code == "NOAUTH")
    );
}
