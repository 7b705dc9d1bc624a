//! The snapshotter's bookkeeping and mounts, on a real root directory (containerd and
//! the kernel's overlayfs are exercised by `tests/snapshotter.rs`).

use super::*;

fn open() -> (tempfile::TempDir, Arc<Snapshotter>) {
    let dir = tempfile::tempdir().unwrap();
    let s = Snapshotter::open(dir.path(), None).unwrap();
    (dir, s)
}

fn no_labels() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn code(e: Error) -> Code {
    match e {
        Error::Snapshot { code, .. } => code,
        other => panic!("not a snapshot error: {other}"),
    }
}

fn source_dir(m: &[MountSpec]) -> PathBuf {
    PathBuf::from(&m[0].source)
}

fn option<'a>(m: &'a MountSpec, name: &str) -> &'a str {
    m.options
        .iter()
        .find_map(|o| o.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {:?}", m.options))
}

#[tokio::test]
async fn layers_stack_as_containerd_overlay_does() {
    let (_dir, s) = open();
    // The first layer: a writable bind of an empty directory.
    let m = s
        .prepare("extract-1", "", no_labels(), false)
        .await
        .unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(
        (m[0].kind.as_str(), &m[0].options[..]),
        ("bind", &["rw".to_string(), "rbind".into()][..])
    );
    let base = source_dir(&m);
    std::fs::write(base.join("a"), b"layer one").unwrap();
    s.commit("layer1", "extract-1", no_labels()).await.unwrap();
    assert_eq!(code(s.stat("extract-1").unwrap_err()), Code::NotFound);
    let info = s.stat("layer1").unwrap();
    assert_eq!((info.kind, info.parent.as_str()), (Kind::Committed, ""));
    assert!(s.usage("layer1").await.unwrap().size > 0);

    // The second layer on it: an overlay with the first as its lower directory.
    let m = s
        .prepare("extract-2", "layer1", no_labels(), false)
        .await
        .unwrap();
    assert_eq!(m[0].kind, "overlay");
    assert_eq!(option(&m[0], "lowerdir"), base.display().to_string());
    let upper = PathBuf::from(option(&m[0], "upperdir"));
    assert!(upper.is_dir() && PathBuf::from(option(&m[0], "workdir")).is_dir());
    s.commit("layer2", "extract-2", no_labels()).await.unwrap();

    // A container on both: lower directories nearest first.
    let m = s
        .prepare("ctr", "layer2", no_labels(), false)
        .await
        .unwrap();
    assert_eq!(
        option(&m[0], "lowerdir"),
        format!("{}:{}", upper.display(), base.display())
    );
    assert_eq!(s.mounts("ctr").unwrap(), m);
    // A view of one layer is a read-only bind of it; of two, a read-only overlay.
    let v = s
        .prepare("view1", "layer1", no_labels(), true)
        .await
        .unwrap();
    assert_eq!((v[0].kind.as_str(), source_dir(&v)), ("bind", base.clone()));
    assert_eq!(v[0].options[0], "ro");
    let v = s
        .prepare("view2", "layer2", no_labels(), true)
        .await
        .unwrap();
    assert_eq!((v[0].kind.as_str(), v[0].options.len()), ("overlay", 1));
    assert_eq!(s.stat("view2").unwrap().kind, Kind::View);
    assert_eq!(
        code(s.commit("x", "view2", no_labels()).await.unwrap_err()),
        Code::FailedPrecondition
    );
}

#[tokio::test]
async fn mistakes_get_the_codes_containerd_expects() {
    let (_dir, s) = open();
    s.prepare("a", "", no_labels(), false).await.unwrap();
    assert_eq!(
        code(s.prepare("a", "", no_labels(), false).await.unwrap_err()),
        Code::AlreadyExists
    );
    assert_eq!(
        code(
            s.prepare("b", "missing", no_labels(), false)
                .await
                .unwrap_err()
        ),
        Code::NotFound
    );
    // An active snapshot cannot be a parent.
    assert_eq!(
        code(s.prepare("b", "a", no_labels(), false).await.unwrap_err()),
        Code::InvalidArgument
    );
    assert_eq!(
        code(s.prepare("", "", no_labels(), false).await.unwrap_err()),
        Code::InvalidArgument
    );
    s.commit("A", "a", no_labels()).await.unwrap();
    assert_eq!(code(s.mounts("A").unwrap_err()), Code::FailedPrecondition);
    s.prepare("c", "", no_labels(), false).await.unwrap();
    assert_eq!(
        code(s.commit("A", "c", no_labels()).await.unwrap_err()),
        Code::AlreadyExists
    );
    s.prepare("child", "A", no_labels(), false).await.unwrap();
    // A parent goes only after its children.
    assert_eq!(
        code(s.remove("A").await.unwrap_err()),
        Code::FailedPrecondition
    );
    assert_eq!(code(s.remove("nope").await.unwrap_err()), Code::NotFound);
    s.remove("child").await.unwrap();
    s.remove("A").await.unwrap();
    assert_eq!(code(s.usage("A").await.unwrap_err()), Code::NotFound);
}

#[tokio::test]
async fn removed_snapshots_leave_no_directories_and_cleanup_takes_orphans() {
    let (dir, s) = open();
    let m = s.prepare("a", "", no_labels(), false).await.unwrap();
    let snapshot_dir = source_dir(&m).parent().unwrap().to_path_buf();
    std::fs::write(source_dir(&m).join("f"), b"x").unwrap();
    s.remove("a").await.unwrap();
    assert!(!snapshot_dir.exists());
    // A directory no record names (a crash between the two) goes at cleanup.
    let orphan = dir.path().join("snapshots").join("999999");
    std::fs::create_dir_all(orphan.join("fs")).unwrap();
    let kept = s.prepare("b", "", no_labels(), false).await.unwrap();
    s.cleanup().await.unwrap();
    assert!(!orphan.exists());
    assert!(source_dir(&kept).is_dir());
}

#[tokio::test]
async fn labels_update_and_filter() {
    let (_dir, s) = open();
    let labels: BTreeMap<String, String> = [(
        "containerd.io/snapshot.ref".to_string(),
        "sha256:abc".to_string(),
    )]
    .into();
    s.prepare("a", "", labels.clone(), false).await.unwrap();
    s.commit("A", "a", labels).await.unwrap();
    s.prepare("b", "A", no_labels(), false).await.unwrap();

    let names = |filters: &[&str]| -> Vec<String> {
        let filters: Vec<String> = filters.iter().map(|f| f.to_string()).collect();
        let mut n: Vec<String> = s
            .list(&filters)
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(&[]), ["A", "b"]);
    // The filter containerd uses to find a snapshot a remote snapshotter made.
    assert_eq!(
        names(&[r#"labels."containerd.io/snapshot.ref"==sha256:abc,parent=="""#]),
        ["A"]
    );
    assert_eq!(names(&[r#"parent=="A""#]), ["b"]);
    assert_eq!(names(&["kind==active", "name==A"]), ["A", "b"]);
    assert_eq!(names(&["kind!=active"]), ["A"]);
    assert_eq!(names(&[r#"labels."containerd.io/snapshot.ref""#]), ["A"]);
    assert_eq!(
        code(s.list(&["size>1".to_string()]).unwrap_err()),
        Code::InvalidArgument
    );

    let mut info = s.stat("b").unwrap();
    info.labels.insert("x".into(), "1".into());
    info.labels.insert("y".into(), "2".into());
    let updated = s.update(info.clone(), &["labels.x".into()]).await.unwrap();
    assert_eq!(updated.labels.get("x").map(String::as_str), Some("1"));
    assert!(
        !updated.labels.contains_key("y"),
        "only the named label changes"
    );
    let updated = s.update(info.clone(), &[]).await.unwrap();
    assert_eq!(updated.labels.len(), 2);
    info.labels.clear();
    let updated = s.update(info.clone(), &["labels.x".into()]).await.unwrap();
    assert!(
        !updated.labels.contains_key("x"),
        "a label missing from the info is removed"
    );
    assert_eq!(
        code(s.update(info, &["parent".into()]).await.unwrap_err()),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn metadata_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Snapshotter::open(dir.path(), None).unwrap();
        s.prepare("a", "", no_labels(), false).await.unwrap();
        s.commit("A", "a", no_labels()).await.unwrap();
        s.prepare("b", "A", no_labels(), false).await.unwrap();
    }
    let s = Snapshotter::open(dir.path(), None).unwrap();
    assert_eq!(s.stat("A").unwrap().kind, Kind::Committed);
    assert_eq!(s.stat("b").unwrap().parent, "A");
    // New ids do not collide with the old ones' directories.
    let m = s.prepare("c", "", no_labels(), false).await.unwrap();
    let b = s.mounts("b").unwrap();
    assert_ne!(source_dir(&m), PathBuf::from(option(&b[0], "upperdir")));
}
