//! Image references and platforms: the `oci-reference` crate, shared with the
//! scheduler (which checks preheat jobs' images with it), re-exported here so the
//! agent names them as before. Its errors become the agent's
//! [`crate::Error::Reference`] (same message).

pub use oci_reference::*;

// `Error` is `oci_reference::Error` (re-exported above); `crate::Error` the agent's.
impl From<Error> for crate::Error {
    fn from(e: Error) -> Self {
        crate::Error::Reference {
            input: e.input().to_string(),
            reason: e.reason().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Reference;

    #[test]
    fn a_bad_reference_is_the_agents_reference_error_with_the_same_message() {
        let e = Reference::parse("app:-tag").unwrap_err();
        let message = e.to_string();
        let agent = crate::Error::from(e);
        assert!(matches!(&agent, crate::Error::Reference { input, .. } if input == "app:-tag"));
        assert_eq!(agent.to_string(), message);
    }
}
