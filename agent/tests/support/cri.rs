//! A client of the Kubernetes CRI image service (`runtime.v1.ImageService`, tonic over
//! containerd's unix socket): images pulled as the kubelet pulls them. `crictl` is not
//! to be had from the package registries here.

use std::path::Path;
use std::time::Duration;

use tessera_proto::cri::image_service_client::ImageServiceClient;
use tessera_proto::cri::{AuthConfig, ImageSpec, PullImageRequest};

use super::containerd::Containerd;

/// `runtime.v1.ImageService/PullImage` on containerd's socket, as the kubelet calls it;
/// returns the image id containerd answers with.
pub fn cri_pull(containerd: &Containerd, image: &str) -> Result<String, String> {
    cri_pull_at(&containerd.socket, image, None)
}

/// `PullImage` on the image service at `socket` (containerd's, or the agent's proxy of
/// it), with the pull secret's `auth` if given, as the kubelet sends a pod's
/// `imagePullSecrets`.
pub fn cri_pull_at(socket: &Path, image: &str, auth: Option<AuthConfig>) -> Result<String, String> {
    let socket = socket.to_path_buf();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        // The URI is a placeholder: the connector dials the unix socket.
        let channel = tonic::transport::Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let socket = socket.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .expect("connect to containerd's socket");
        let mut client = ImageServiceClient::new(channel);
        let request = PullImageRequest {
            image: Some(ImageSpec {
                image: image.to_string(),
                ..ImageSpec::default()
            }),
            auth,
            ..PullImageRequest::default()
        };
        let answer = tokio::time::timeout(Duration::from_secs(120), client.pull_image(request))
            .await
            .map_err(|_| "CRI pull took over 120 s".to_string())?
            .map_err(|status| format!("{}: {}", status.code(), status.message()))?;
        Ok(answer.into_inner().image_ref)
    })
}
