//! The OCI runtime spec of a container booted from an image by `tessera run`: the
//! image config's command, environment, working directory and user on containerd's
//! default Linux spec (the namespaces, mounts, capabilities and masked paths that `ctr
//! run` gives a container), in the node's network namespace as `ctr run --net-host`.
//!
//! A restored container does not use this: it takes the spec recorded in its checkpoint,
//! so its namespaces and mounts are the ones CRIU dumped.

use serde_json::{json, Value};

use crate::{Error, Result};

/// containerd's default `PATH` for an image that sets none.
const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The capabilities containerd's default spec keeps.
const DEFAULT_CAPABILITIES: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The spec of container `id` (in containerd namespace `namespace`) booting the image
/// whose OCI config is `image_config`, with hostname `hostname`.
pub fn boot_spec(image_config: &[u8], namespace: &str, id: &str, hostname: &str) -> Result<Value> {
    let invalid = |reason: String| Error::Setting {
        setting: "image config".into(),
        problem: reason,
    };
    let config: Value = serde_json::from_slice(image_config)
        .map_err(|e| invalid(format!("the image config is not JSON: {e}")))?;
    let c = &config["config"];
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut args = strings(&c["Entrypoint"]);
    args.extend(strings(&c["Cmd"]));
    if args.is_empty() {
        return Err(invalid(
            "the image has no Entrypoint or Cmd: there is nothing to boot".into(),
        ));
    }
    let mut env = strings(&c["Env"]);
    if !env.iter().any(|e| e.starts_with("PATH=")) {
        env.insert(0, DEFAULT_PATH.into());
    }
    let cwd = c["WorkingDir"]
        .as_str()
        .filter(|d| !d.is_empty())
        .unwrap_or("/");
    let (uid, gid) = user(c["User"].as_str().unwrap_or(""))
        .ok_or_else(|| invalid(format!("user {} is not numeric (UID[:GID]): `tessera run` does not look names up in the image's /etc/passwd", c["User"])))?;
    Ok(json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": { "uid": uid, "gid": gid },
            "args": args,
            "env": env,
            "cwd": cwd,
            "capabilities": {
                "bounding": DEFAULT_CAPABILITIES,
                "effective": DEFAULT_CAPABILITIES,
                "permitted": DEFAULT_CAPABILITIES,
            },
            "rlimits": [{ "type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024 }],
            "noNewPrivileges": true,
        },
        "root": { "path": "rootfs" },
        "hostname": hostname,
        "mounts": [
            { "destination": "/proc", "type": "proc", "source": "proc",
              "options": ["nosuid", "noexec", "nodev"] },
            { "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
              "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
            { "destination": "/dev/pts", "type": "devpts", "source": "devpts",
              "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"] },
            { "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
              "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"] },
            { "destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
              "options": ["nosuid", "noexec", "nodev"] },
            { "destination": "/sys", "type": "sysfs", "source": "sysfs",
              "options": ["nosuid", "noexec", "nodev", "ro"] },
            { "destination": "/run", "type": "tmpfs", "source": "tmpfs",
              "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
        ],
        "linux": {
            "resources": { "devices": [{ "allow": false, "access": "rwm" }] },
            "cgroupsPath": format!("/{namespace}/{id}"),
            // No network namespace: the node's, as `ctr run --net-host`.
            "namespaces": [
                { "type": "pid" }, { "type": "ipc" }, { "type": "uts" }, { "type": "mount" },
            ],
            "maskedPaths": [
                "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
                "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
            ],
            "readonlyPaths": [
                "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
            ],
        },
    }))
}

/// `UID[:GID]` (numeric; empty is root).
fn user(user: &str) -> Option<(u32, u32)> {
    if user.is_empty() {
        return Some((0, 0));
    }
    match user.split_once(':') {
        Some((u, g)) => Some((u.parse().ok()?, g.parse().ok()?)),
        None => {
            let uid = user.parse().ok()?;
            Some((uid, uid))
        }
    }
}

/// Sets `spec`'s hostname.
pub fn set_hostname(spec: &mut Value, hostname: &str) {
    spec["hostname"] = json!(hostname);
}

/// Whether `spec` gives the container its own UTS namespace (its own hostname).
pub fn has_own_uts_namespace(spec: &Value) -> bool {
    spec["linux"]["namespaces"].as_array().is_some_and(|ns| {
        ns.iter()
            .any(|n| n["type"] == "uts" && n.get("path").is_none_or(|p| p == ""))
    })
}

/// Sets annotation `key` on `spec`.
pub fn annotate(spec: &mut Value, key: &str, value: &str) {
    if !spec["annotations"].is_object() {
        spec["annotations"] = json!({});
    }
    spec["annotations"][key] = json!(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_config_gives_command_environment_and_user() {
        let config = br#"{"config":{"Entrypoint":["python3"],"Cmd":["/app/serve.py"],
            "Env":["A=1"],"WorkingDir":"/app","User":"1000:100"}}"#;
        let spec = boot_spec(config, "default", "web", "web-1").unwrap();
        assert_eq!(spec["process"]["args"], json!(["python3", "/app/serve.py"]));
        assert_eq!(spec["process"]["env"], json!([DEFAULT_PATH, "A=1"]));
        assert_eq!(spec["process"]["cwd"], "/app");
        assert_eq!(spec["process"]["user"], json!({"uid": 1000, "gid": 100}));
        assert_eq!(spec["hostname"], "web-1");
        assert_eq!(spec["linux"]["cgroupsPath"], "/default/web");
        assert!(has_own_uts_namespace(&spec));
    }

    #[test]
    fn an_image_without_a_command_or_with_a_named_user_is_refused() {
        assert!(boot_spec(br#"{"config":{}}"#, "n", "i", "h").is_err());
        let named = br#"{"config":{"Cmd":["sh"],"User":"www-data"}}"#;
        let e = boot_spec(named, "n", "i", "h").unwrap_err().to_string();
        assert!(e.contains("not numeric"), "{e}");
        assert!(boot_spec(b"not json", "n", "i", "h").is_err());
    }

    #[test]
    fn hostname_and_annotations_are_set_on_a_recorded_spec() {
        let mut spec = json!({"hostname": "old", "linux": {"namespaces": [{"type": "uts", "path": "/proc/1/ns/uts"}]}});
        set_hostname(&mut spec, "new");
        annotate(&mut spec, "org.criu.config", "/x");
        assert_eq!(spec["hostname"], "new");
        assert_eq!(spec["annotations"]["org.criu.config"], "/x");
        assert!(!has_own_uts_namespace(&spec));
    }
}
