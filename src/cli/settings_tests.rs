//! Precedence of the settings layers: defaults < config file < APP_* variables < flags.

use super::*;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

fn file(text: &str) -> Layer {
    Layer::from_toml(text, Path::new("both.toml")).unwrap()
}

fn env(pairs: &[(&str, &str)]) -> Layer {
    let map: HashMap<String, String> = pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect();
    Layer::from_env(|name| map.get(name).cloned())
}

fn flags(args: &[&str]) -> Layer {
    use clap::Parser;
    let cli = crate::cli::Cli::try_parse_from(std::iter::once("app").chain(args.iter().copied())).unwrap();
    Layer::from_flags(&cli.serve)
}

fn settings(mode: Mode, file: Layer, env: Layer, flags: Layer) -> Settings {
    assemble(mode, file, env, flags, false).unwrap()
}

const BOTH: &str = r#"
[server]
bind = "127.0.0.1:9001"
data_dir = "from-file"
lease_secs = 12

[worker]
name = "box-1"
work_dir = "work-from-file"
max_jobs = 3
url = "http://file:8000"
"#;

#[test]
fn with_nothing_given_the_defaults_hold() {
    let settings = settings(Mode::Embedded, Layer::default(), Layer::default(), Layer::default());
    assert_eq!(settings.bind, DEFAULT_BIND);
    assert_eq!(settings.server.data_dir, Path::new("app-data"));
    assert_eq!(settings.server.lease, Duration::from_secs(30));
    assert_eq!(settings.worker.name, "local", "the embedded worker's default name");
    assert_eq!(settings.worker.work_dir, Path::new("app-work"));
    assert!(settings.server.tokens.is_empty() && settings.worker.connection.token.is_none());
}

#[test]
fn the_file_beats_the_defaults_the_environment_beats_the_file_and_flags_beat_both() {
    let only_file = settings(Mode::Embedded, file(BOTH), Layer::default(), Layer::default());
    assert_eq!(only_file.bind, "127.0.0.1:9001");
    assert_eq!(only_file.server.data_dir, Path::new("from-file"));
    assert_eq!(only_file.server.lease, Duration::from_secs(12));

    let environment =
        env(&[("APP_BIND", "127.0.0.1:9002"), ("APP_DATA_DIR", "from-env"), ("APP_WORK_DIR", "work-env")]);
    let with_env = settings(Mode::Embedded, file(BOTH), environment, Layer::default());
    assert_eq!(with_env.bind, "127.0.0.1:9002");
    assert_eq!(with_env.server.data_dir, Path::new("from-env"));
    assert_eq!(with_env.worker.work_dir, Path::new("work-env"));
    assert_eq!(with_env.server.lease, Duration::from_secs(12), "keys the environment leaves alone keep the file's");
    assert_eq!(with_env.worker.max_jobs, Some(3));

    let environment = env(&[("APP_BIND", "127.0.0.1:9002"), ("APP_DATA_DIR", "from-env")]);
    let given = flags(&["--bind", "127.0.0.1:9003", "--max-jobs", "7"]);
    let with_flags = settings(Mode::Embedded, file(BOTH), environment, given);
    assert_eq!(with_flags.bind, "127.0.0.1:9003");
    assert_eq!(with_flags.server.data_dir, Path::new("from-env"));
    assert_eq!(with_flags.worker.max_jobs, Some(7));
    assert_eq!(with_flags.worker.work_dir, Path::new("work-from-file"));
}

#[test]
fn one_file_with_both_tables_configures_each_mode() {
    let embedded = settings(Mode::Embedded, file(BOTH), Layer::default(), Layer::default());
    assert_eq!((embedded.server.data_dir.as_path(), embedded.worker.name.as_str()), (Path::new("from-file"), "box-1"));
    assert_eq!(embedded.worker.work_dir, Path::new("work-from-file"));
    let worker = settings(Mode::ClientOnly, file(BOTH), Layer::default(), Layer::default());
    assert_eq!((worker.worker.url.as_str(), worker.worker.max_jobs), ("http://file:8000", Some(3)));
    let server = settings(Mode::ServerOnly, file(BOTH), Layer::default(), Layer::default());
    assert_eq!(server.server.lease, Duration::from_secs(12));
}

#[test]
fn the_worker_url_comes_from_the_highest_layer_and_is_required_by_client_only() {
    let from_env = settings(Mode::ClientOnly, file(BOTH), env(&[("APP_URL", "http://env:8000")]), Layer::default());
    assert_eq!(from_env.worker.url, "http://env:8000");
    let from_flag = settings(
        Mode::ClientOnly,
        file(BOTH),
        env(&[("APP_URL", "http://env:8000")]),
        flags(&["--url", "http://flag:1"]),
    );
    assert_eq!(from_flag.worker.url, "http://flag:1");
    let missing = assemble(Mode::ClientOnly, Layer::default(), Layer::default(), Layer::default(), false).unwrap_err();
    assert!(missing.to_string().contains("--client-only needs the server's URL"), "{missing}");
}

#[test]
fn unknown_keys_and_tables_are_refused_by_name_with_their_line() {
    for (text, key, line) in [
        ("[server]\nbind = \"x\"\nleese_secs = 3\n", "leese_secs", "line 3"),
        ("[worker]\nwrk_dir = \"w\"\n", "wrk_dir", "line 2"),
        ("[workers]\nname = \"w\"\n", "workers", "line 1"),
        ("[server]\nlease_secs = \"soon\"\n", "lease_secs", "line 2"),
    ] {
        let error = Layer::from_toml(text, Path::new("both.toml")).unwrap_err().to_string();
        assert!(error.contains(key) && error.contains(line), "{error}");
        assert!(error.starts_with("config file both.toml"), "{error}");
        assert_eq!(error.lines().count(), 1, "{error}");
    }
    // A token value has no place in a file (it would end up in backups and diffs).
    let error = Layer::from_toml("[worker]\ntoken = \"secret\"\n", Path::new("both.toml")).unwrap_err();
    assert!(error.to_string().contains("unknown field `token`"), "{error}");
}

#[test]
fn blank_variables_count_as_unset() {
    let settings =
        settings(Mode::Embedded, file(BOTH), env(&[("APP_BIND", " "), ("APP_DATA_DIR", "")]), Layer::default());
    assert_eq!(settings.bind, "127.0.0.1:9001");
    assert_eq!(settings.server.data_dir, Path::new("from-file"));
}

#[test]
fn a_token_value_and_a_token_file_of_one_layer_are_one_choice() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = |name: &str, token: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("# comment\n{token}\n")).unwrap();
        path.display().to_string()
    };
    let from_file =
        file(&format!("[worker]\nurl = \"http://h:1\"\ntoken_file = \"{}\"\n", token_file("f", "file-token")));
    let token = |layers: (Layer, Layer, Layer)| {
        settings(Mode::ClientOnly, layers.0, layers.1, layers.2).worker.connection.token.unwrap()
    };
    assert_eq!(token((from_file, Layer::default(), Layer::default())), "file-token");
    let from_file =
        file(&format!("[worker]\nurl = \"http://h:1\"\ntoken_file = \"{}\"\n", token_file("f", "file-token")));
    assert_eq!(token((from_file, env(&[("APP_TOKEN", "env-token")]), Layer::default())), "env-token");
    let both_in_env = env(&[("APP_TOKEN", "env-token"), ("APP_TOKEN_FILE", &token_file("e", "env-file-token"))]);
    let url = flags(&["--url", "http://h:1"]);
    assert_eq!(
        token((Layer::default(), both_in_env, url)),
        "env-file-token",
        "the file of a layer wins over its value"
    );
    let flag = flags(&["--url", "http://h:1", "--token-file", &token_file("g", "flag-token")]);
    assert_eq!(token((Layer::default(), env(&[("APP_TOKEN", "env-token")]), flag)), "flag-token");
}

#[test]
fn the_embedded_worker_uses_the_servers_worker_token_and_keeps_its_url_for_later() {
    let environment = env(&[
        ("APP_WORKER_TOKEN", "w0rker-token-long-enough"),
        ("APP_USER_TOKEN", "us3r-token-long-enough-too"),
        ("APP_TOKEN", "some-user-token-of-the-shell"),
        ("APP_URL", "http://elsewhere:8000"),
    ]);
    let settings = settings(Mode::Embedded, Layer::default(), environment, Layer::default());
    assert_eq!(settings.worker.connection.token.as_deref(), Some("w0rker-token-long-enough"));
    assert!(settings.worker.url.is_empty(), "set to the server's own address once it listens");
    assert!(!settings.server.tokens.is_empty());
}

#[test]
fn user_tokens_name_their_users_in_the_environment_and_admins_come_from_the_file() {
    use server::auth::{Caller, Holder};
    let (a, b, plain) = ("aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb", "cccccccccccccccccccc");
    let listed = format!("user-a:{a}, admin:user-b:{b},{plain}");
    let admins = || file("[server]\nadmins = [\"user-a\"]\n");
    let tokens =
        settings(Mode::ServerOnly, admins(), env(&[("APP_USER_TOKEN", &listed)]), Layer::default()).server.tokens;
    let user = |name: &str, admin| Some(Holder::User(Caller { name: name.into(), admin }));
    assert_eq!(tokens.holder_of(a), user("user-a", true), "made an admin by the file's list");
    assert_eq!(tokens.holder_of(b), user("user-b", true));
    assert_eq!(tokens.holder_of(plain), user("default", false));
    assert_eq!(tokens.user_names(), ["default", "user-a", "user-b"]);
    // An admin no token names is refused, by name; a bad entry by its place, never its token.
    let error =
        assemble(Mode::ServerOnly, admins(), env(&[("APP_USER_TOKEN", plain)]), Layer::default(), false).unwrap_err();
    assert!(error.to_string().contains("`admins` lists `user-a`"), "{error}");
    let bad = format!("user-a:{a},Bob:{b}");
    let error = assemble(Mode::ServerOnly, Layer::default(), env(&[("APP_USER_TOKEN", &bad)]), Layer::default(), false)
        .unwrap_err()
        .to_string();
    assert!(error.contains("APP_USER_TOKEN (entry 2) has a bad name") && !error.contains(b), "{error}");
}

#[test]
fn tls_files_go_together_across_layers() {
    let both = file("[server]\ntls_cert = \"a.pem\"\ntls_key = \"a.key\"\n");
    let error = assemble(Mode::ServerOnly, both, Layer::default(), flags(&["--tls-cert", "b.pem"]), false).unwrap_err();
    assert!(error.to_string().contains("`tls_cert` and `tls_key` go together"), "{error}");
    let both = file("[server]\ntls_cert = \"a.pem\"\ntls_key = \"a.key\"\n");
    let settings = settings(Mode::ServerOnly, both, Layer::default(), Layer::default());
    assert_eq!(settings.server.tls.unwrap().key, Path::new("a.key"));
}

#[test]
fn a_bad_worker_name_is_refused_by_name() {
    let error = assemble(Mode::Embedded, Layer::default(), env(&[("APP_WORKER_NAME", "a/b")]), Layer::default(), false)
        .unwrap_err();
    assert!(error.to_string().contains("worker name `a/b`"), "{error}");
}

#[test]
fn a_worker_that_may_run_no_job_is_refused() {
    for (file, flags) in
        [(file("[worker]\nmax_jobs = 0\n"), Layer::default()), (Layer::default(), flags(&["--max-jobs", "0"]))]
    {
        let error = assemble(Mode::Embedded, file, Layer::default(), flags, false).unwrap_err();
        assert!(format!("{error:#}").contains("must be at least 1"), "{error:#}");
    }
}

#[test]
fn metrics_are_public_only_when_the_file_or_the_flag_says_so() {
    let none = Layer::default;
    assert!(!settings(Mode::ServerOnly, none(), none(), none()).server.metrics_public);
    let from_file = file("[server]\nmetrics_public = true\n");
    assert!(settings(Mode::ServerOnly, from_file, none(), none()).server.metrics_public);
    assert!(settings(Mode::ServerOnly, none(), none(), flags(&["--metrics-public"])).server.metrics_public);
    let wrong = Layer::from_toml("[server]\nmetrics_public = \"yes\"\n", Path::new("both.toml")).unwrap_err();
    assert!(wrong.to_string().contains("metrics_public"), "{wrong}");
}

#[test]
fn a_list_of_server_urls_reaches_the_worker_as_given() {
    let urls = "http://head1:8000,http://head2:8000";
    let from_flag = settings(Mode::ClientOnly, Layer::default(), Layer::default(), flags(&["--url", urls]));
    assert_eq!(from_flag.worker.url, urls);
    let from_file =
        settings(Mode::ClientOnly, file(&format!("[worker]\nurl = \"{urls}\"\n")), Layer::default(), Layer::default());
    assert_eq!(client::Client::new(&from_file.worker.url).unwrap().urls(), ["http://head1:8000", "http://head2:8000"]);
}

#[test]
fn the_example_config_files_are_read_as_they_are_shipped() {
    let read = |name: &str| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs").join(name);
        Layer::from_toml(&std::fs::read_to_string(&path).unwrap(), &path).unwrap()
    };
    let worker = settings(Mode::ClientOnly, read("worker.example.toml"), Layer::default(), Layer::default()).worker;
    assert_eq!(worker.checkpoint_interval, Duration::from_secs(300));
    assert_eq!(worker.checkpoint_max_bytes, 10 << 30);
    assert_eq!(worker.code_cache_bytes, 5 << 30);
    settings(Mode::ServerOnly, read("server.example.toml"), Layer::default(), Layer::default());
}

#[test]
fn the_database_url_comes_from_the_flag_the_environment_or_the_file_in_that_order() {
    let with_file = "[server]\ndatabase_url = \"postgres://app@file:5432/app\"\n";
    assert_eq!(settings(Mode::ServerOnly, file(BOTH), Layer::default(), Layer::default()).server.database_url, None);
    let only_file = settings(Mode::ServerOnly, file(with_file), Layer::default(), Layer::default());
    assert_eq!(only_file.server.database_url.as_deref(), Some("postgres://app@file:5432/app"));
    let environment = env(&[("APP_DATABASE_URL", "postgres://app@env:5432/app")]);
    let with_env = settings(Mode::ServerOnly, file(with_file), environment, Layer::default());
    assert_eq!(with_env.server.database_url.as_deref(), Some("postgres://app@env:5432/app"));
    let environment = env(&[("APP_DATABASE_URL", "postgres://app@env:5432/app")]);
    let given = flags(&["--database-url", "postgres://app@flag:5432/app"]);
    let with_flag = settings(Mode::ServerOnly, file(with_file), environment, given);
    assert_eq!(with_flag.server.database_url.as_deref(), Some("postgres://app@flag:5432/app"));
}

#[test]
fn a_database_url_is_seen_to_hold_a_password() {
    assert!(url_has_password("postgres://app:hunter2@db:5432/app"));
    assert!(!url_has_password("postgres://app@db:5432/app"));
    assert!(!url_has_password("postgres://db/app?user=x:y"));
}

#[test]
fn preemption_settings_come_from_the_file_and_the_flags_and_bad_ones_are_refused() {
    use server::config::Preemptible;
    let defaults = settings(Mode::ServerOnly, Layer::default(), Layer::default(), Layer::default()).server;
    assert_eq!((defaults.min_runtime, defaults.preemptible), (Duration::from_secs(600), Preemptible::Checkpointing));
    let text = "[server]\nmin_runtime_secs = 30\npreemptible = false\n";
    let server = settings(Mode::ServerOnly, file(text), Layer::default(), Layer::default()).server;
    assert_eq!((server.min_runtime, server.preemptible), (Duration::from_secs(30), Preemptible::Never));
    assert_eq!(defaults.backfill_after, Duration::from_secs(900));
    let flags = flags(&["--min-runtime-secs", "0", "--preemptible", "true", "--backfill-after-secs", "60"]);
    let server = settings(Mode::ServerOnly, file(text), Layer::default(), flags).server;
    assert_eq!((server.min_runtime, server.preemptible), (Duration::ZERO, Preemptible::All), "the flags win");
    assert_eq!(server.backfill_after, Duration::from_secs(60));
    let word = settings(
        Mode::ServerOnly,
        file("[server]\npreemptible = \"checkpointing\"\n"),
        Layer::default(),
        Layer::default(),
    );
    assert_eq!(word.server.preemptible, Preemptible::Checkpointing);
    for (text, expected) in [
        ("[server]\nmin_runtime_secs = -1\n", "`min_runtime_secs` must be a number of seconds from 0 to 604800"),
        ("[server]\nmin_runtime_secs = 1e9\n", "`min_runtime_secs` must be a number of seconds from 0 to 604800"),
        ("[server]\npreemptible = \"sometimes\"\n", "`preemptible` must be true, false or \"checkpointing\""),
        ("[server]\nbackfill_after_secs = -3\n", "`backfill_after_secs` must be a number of seconds from 0 to 604800"),
    ] {
        let error = assemble(Mode::ServerOnly, file(text), Layer::default(), Layer::default(), false).unwrap_err();
        assert!(error.to_string().contains(expected), "{text}: {error}");
    }
    let error = Layer::from_toml("[server]\npreemptible = 3\n", Path::new("p.toml")).unwrap_err().to_string();
    assert!(error.contains("preemptible") || error.contains("line 2"), "{error}");
}

#[test]
fn shares_and_quotas_come_from_the_file_and_bad_weights_are_refused_by_name() {
    use shared::fair_share::Quota;
    let text = "[server]\nshare_half_life_secs = 86400\n[server.shares]\nuser-a = 2\nuser-b = 0.5\n\
                [server.quotas]\nuser-a = { max_gpus = 8, max_running = 3 }\nuser-c = { max_gpus = 2 }\n\
                [server.default_quota]\nmax_running = 10\n";
    let shares = settings(Mode::ServerOnly, file(text), Layer::default(), Layer::default()).server.shares;
    assert_eq!(shares.half_life_secs, 86_400.0);
    assert_eq!((shares.weight("user-a"), shares.weight("user-b"), shares.weight("other")), (2.0, 0.5, 1.0));
    assert_eq!(shares.quota("user-a"), Quota { max_gpus: Some(8), max_running: Some(3) });
    assert_eq!(shares.quota("user-c"), Quota { max_gpus: Some(2), max_running: None });
    assert_eq!(shares.quota("other"), Quota { max_gpus: None, max_running: Some(10) });
    let flag = settings(Mode::ServerOnly, file(text), Layer::default(), flags(&["--share-half-life-secs", "60"]));
    assert_eq!(flag.server.shares.half_life_secs, 60.0, "the flag beats the file");

    for (text, expected) in [
        ("[server.shares]\nuser-a = 0\n", "the share of `user-a` must be a number above 0, not 0"),
        ("[server.shares]\nuser-a = -2\n", "the share of `user-a` must be a number above 0, not -2"),
        ("[server.shares]\nuser-a = \"lots\"\n", "the share of `user-a` must be a number above 0, not \"lots\""),
        ("[server.shares]\nuser-a = nan\n", "the share of `user-a` must be a number above 0, not NaN"),
        ("[server.shares]\nUser_A = 1\n", "`[server.shares]` lists a bad name"),
        ("[server.quotas]\n\"a b\" = { max_gpus = 1 }\n", "`[server.quotas]` lists a bad name"),
        ("[server]\nshare_half_life_secs = 0\n", "`share_half_life_secs` must be a number of seconds above 0"),
    ] {
        let error = assemble(Mode::ServerOnly, file(text), Layer::default(), Layer::default(), false).unwrap_err();
        assert!(error.to_string().contains(expected), "{text}: {error}");
    }
    for (text, key) in [
        ("[server.quotas]\nuser-a = { max_gpu = 1 }\n", "max_gpu"),
        ("[server.quotas]\nuser-a = { max_gpus = -1 }\n", "invalid value: integer `-1`"),
    ] {
        let error = Layer::from_toml(text, Path::new("both.toml")).unwrap_err().to_string();
        assert!(error.contains(key) && error.contains("line 2"), "{error}");
    }
}
