//! `coli chat --session NAME`: a conversation's messages kept across runs in
//! `<state dir>/sessions/NAME.json` (its KV cache lives in the prefix cache's directory,
//! docs/KV_CACHE.md). The file names the store it was made with; another store's session is
//! refused rather than continued with a different model.

use anyhow::{bail, Context, Result};
use coli_engine::ChatMessage;
use coli_format::disk::StoreId;
use serde_json::{json, Value};
use std::path::PathBuf;

/// Version of the session file.
const SESSION_VERSION: u64 = 1;

/// A named conversation (see the module doc).
pub struct Session {
    /// Its name.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// The messages saved so far (system, user and assistant turns).
    pub messages: Vec<ChatMessage>,
    store_id: StoreId,
}

impl Session {
    /// Opens session `name` of the store `store_id` (empty when it does not exist yet).
    ///
    /// # Errors
    /// No state directory is known; the file cannot be read, is not a session file, or belongs
    /// to another store (each message names the file and what to do).
    pub fn open(name: &str, store_id: StoreId) -> Result<Session> {
        let dir = coli_engine::usage::default_state_dir()
            .context("no state directory for sessions: set COLI_STATE_DIR (or HOME)")?
            .join("sessions");
        let path = dir.join(format!("{name}.json"));
        let mut s = Session {
            name: name.to_string(),
            path,
            messages: Vec::new(),
            store_id,
        };
        let bytes = match std::fs::read(&s.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(s),
            Err(e) => return Err(e).with_context(|| format!("reading {}", s.path.display())),
        };
        let bad = |what: &str| {
            anyhow::anyhow!(
                "{} is not a coli chat session ({what}); remove it or pick another --session name",
                s.path.display()
            )
        };
        let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad("not JSON"))?;
        if v["version"].as_u64() != Some(SESSION_VERSION) {
            return Err(bad("unknown version"));
        }
        let sid = v["store_id"].as_str().ok_or_else(|| bad("no store_id"))?;
        if sid != store_id.to_string() {
            bail!(
                "session {name} ({}) was made with another store ({sid}, this one is {store_id}); pick another --session name",
                s.path.display()
            );
        }
        for m in v["messages"].as_array().ok_or_else(|| bad("no messages"))? {
            let (Some(role), Some(content)) = (m["role"].as_str(), m["content"].as_str()) else {
                return Err(bad("a message without role or content"));
            };
            s.messages.push(ChatMessage::new(role, content));
        }
        Ok(s)
    }

    /// Saves `messages` (a temporary file, fsynced, renamed over the session file; mode 0600).
    ///
    /// # Errors
    /// The directory or file cannot be written (the message names it).
    pub fn save(&self, messages: &[ChatMessage]) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let dir = self.path.parent().expect("a session file has a directory");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let v = json!({
            "version": SESSION_VERSION,
            "store_id": self.store_id.to_string(),
            "messages": messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
        });
        let tmp = dir.join(format!(".{}.tmp.{}", self.name, std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(serde_json::to_string_pretty(&v)?.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            std::fs::File::open(dir)?.sync_all()
        };
        write().with_context(|| format!("saving session {}", self.path.display()))
    }
}
