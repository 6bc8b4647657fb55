// Package istio holds the conventions Istio users already write into their
// registries: the label and annotation keys that carry mesh metadata, and
// how a port's name or application protocol names its protocol. Plugins
// read them from their sources (Kubernetes objects, Consul tags, Istio
// ServiceEntries) through this package, so every registry understands the
// same spelling the same way.
package istio

// Label and annotation keys read by the bundled plugins, spelled as Istio
// (and `istioctl`) write them.
const (
	// LabelNetwork names the network of a workload, a namespace, or (on a
	// Service) the network that an east-west gateway leads into.
	LabelNetwork = "topology.istio.io/network"
	// LabelSubzone is the locality subzone of a pod or node; region and
	// zone come from Kubernetes' own topology labels.
	LabelSubzone = "topology.istio.io/subzone"
	// LabelLocality is Istio's older per-workload locality label,
	// "region.zone.subzone" (dots, since '/' is not allowed in label
	// values).
	LabelLocality = "istio-locality"
	// LabelTLSMode = "istio" marks a workload whose sidecar accepts Istio
	// mTLS.
	LabelTLSMode = "security.istio.io/tlsMode"
	// LabelGatewayPort is the port of an east-west gateway service that
	// carries cross-network mTLS; DefaultGatewayPort when absent.
	LabelGatewayPort = "networking.istio.io/gatewayPort"
	// LabelMultiCluster = "true" marks a Secret holding a member cluster's
	// kubeconfig, as `istioctl create-remote-secret` writes it.
	LabelMultiCluster = "istio/multiCluster"
	// AnnotationCluster, on a remote secret, names the cluster ID its data
	// key registers (istioctl writes it; readers go by the key).
	AnnotationCluster = "networking.istio.io/cluster"

	// AnnotationExportTo lists the namespaces a Service is visible to
	// ("." for its own, "*" for all).
	AnnotationExportTo = "networking.istio.io/exportTo"
	// AnnotationNodeSelector, on a NodePort gateway service, selects the
	// nodes whose addresses reach the gateway (a JSON label map).
	AnnotationNodeSelector = "traffic.istio.io/nodeSelector"
)

// TLSModeIstio is the value of LabelTLSMode that turns on Istio mTLS.
const TLSModeIstio = "istio"

// DefaultGatewayPort is the port of an east-west gateway when its service
// does not say otherwise (Istio's 15443, SNI passthrough).
const DefaultGatewayPort = 15443
