# VMs and external services described as Istio ServiceEntry and
# WorkloadEntry objects, from files and from a cluster's CRDs.
plugin "serviceentry" {
  config {
    dir        = "/etc/estuary/serviceentries"
    cluster_id = "vms"
    network    = "vm-network"
    kubernetes {
      kubeconfig = "/etc/estuary/kubeconfig"
      namespaces = ["vms"]
    }
  }
}
