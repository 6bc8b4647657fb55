# Consul and Kubernetes side by side, for a migration: a service registered
# in both (same hostname) merges, with the endpoints of both registries.
# Order matters: the first plugin's service attributes win conflicts.
mesh {
  cluster_id = "cluster1"
  network    = "network1"
}

plugin "kubernetes" {
  config {
    kubeconfig = "/etc/estuary/kubeconfig"
  }
}

plugin "consul" {
  config {
    address     = "127.0.0.1:8500"
    datacenters = ["dc1"]
    token_file  = "/etc/estuary/consul-token"
    # Give Consul services Kubernetes hostnames so they merge:
    domain_suffix = "default.svc.cluster.local"
    wait_time     = "5m"
  }
}
