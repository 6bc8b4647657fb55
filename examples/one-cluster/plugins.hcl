# One Kubernetes cluster: the primary cluster from a kubeconfig. Member
# clusters join at run time through Secrets labelled
# istio/multiCluster=true in istio-system (istioctl x create-remote-secret).
mesh {
  cluster_id = "cluster1"
  network    = "network1"
}

plugin "kubernetes" {
  config {
    kubeconfig = "/etc/estuary/kubeconfig"
    cluster_id = "cluster1"
    # Remote secrets may not run programs or read local files unless allowed:
    # allow_kubeconfig_options = ["exec"]
    allowed_servers = ["10.0.0.0/8", "*.eks.amazonaws.com"]
  }
}
