package sdk

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// InstanceID identifies one instance inside a plugin: one Kubernetes cluster,
// one Consul datacenter, one static registry.
type InstanceID struct {
	// Provider is the kind of registry: ProviderKubernetes, ProviderConsul, ...
	Provider string `json:"provider"`
	// Cluster is the instance's cluster identity.
	Cluster string `json:"cluster"`
}

// String renders the ID as "Provider/Cluster".
func (id InstanceID) String() string { return id.Provider + "/" + id.Cluster }

// Well-known providers. A third-party plugin uses a name of its own.
const (
	ProviderKubernetes   = "Kubernetes"
	ProviderConsul       = "Consul"
	ProviderServiceEntry = "ServiceEntry"
	ProviderStatic       = "Static"
)

// InstanceProperties tell the host how to treat an instance, so the host
// needs no provider-specific branches.
type InstanceProperties struct {
	// ClusterScoped instances belong to one cluster: a proxy that declares
	// CLUSTER_ID is matched only against instances of that cluster.
	ClusterScoped bool `json:"cluster_scoped"`
	// DefaultNetwork is the network of endpoints that carry none.
	DefaultNetwork string `json:"default_network,omitempty"`
	// SyncTimeout bounds how long readiness waits for the instance to sync;
	// zero means the host's default.
	SyncTimeout time.Duration `json:"sync_timeout"`
}

// Resolution says how clients resolve a service's endpoints.
type Resolution int

const (
	// ResolutionStatic: endpoint addresses are IPs known to the registry.
	ResolutionStatic Resolution = iota
	// ResolutionPassthrough: forward to the original destination (Istio NONE).
	ResolutionPassthrough
	// ResolutionDNS: endpoint addresses are DNS names, all used (Istio DNS).
	ResolutionDNS
	// ResolutionDNSRoundRobin: DNS names, one used at a time.
	ResolutionDNSRoundRobin
)

var resolutionNames = [...]string{"STATIC", "NONE", "DNS", "DNS_ROUND_ROBIN"}

func (r Resolution) String() string {
	if int(r) < len(resolutionNames) && r >= 0 {
		return resolutionNames[r]
	}
	return fmt.Sprintf("Resolution(%d)", int(r))
}

// ParseResolution accepts Istio's spellings: STATIC, NONE, DNS,
// DNS_ROUND_ROBIN (case-insensitive).
func ParseResolution(s string) (Resolution, error) {
	for i, n := range resolutionNames {
		if strings.EqualFold(s, n) {
			return Resolution(i), nil
		}
	}
	return 0, fmt.Errorf("unknown resolution %q (want one of %s)", s, strings.Join(resolutionNames[:], ", "))
}

// TLSMode says whether a workload accepts Istio mTLS.
type TLSMode int

const (
	// TLSModeDisabled: the workload speaks plain text.
	TLSModeDisabled TLSMode = iota
	// TLSModeIstio: the workload accepts Istio mTLS
	// (label security.istio.io/tlsMode=istio).
	TLSModeIstio
)

func (m TLSMode) String() string {
	if m == TLSModeIstio {
		return "istio"
	}
	return "disabled"
}

// ParseTLSMode accepts "istio" and "disabled" (or empty).
func ParseTLSMode(s string) (TLSMode, error) {
	switch strings.ToLower(s) {
	case "istio":
		return TLSModeIstio, nil
	case "", "disabled":
		return TLSModeDisabled, nil
	}
	return 0, fmt.Errorf("unknown TLS mode %q (want \"istio\" or \"disabled\")", s)
}

// MTLSMode is a service's own workload mTLS mode: what clients do about
// TLS towards its endpoints, overriding the host's mesh-wide mode
// (plugins.hcl mesh { mtls }) for this service only. The values are the
// mesh's; MTLSModeUnset follows the mesh.
type MTLSMode int

const (
	// MTLSModeUnset follows the mesh's mode.
	MTLSModeUnset MTLSMode = iota
	// MTLSModeStrict reaches every endpoint over Istio mTLS (Istio: a
	// DestinationRule with tls mode ISTIO_MUTUAL).
	MTLSModeStrict
	// MTLSModePermissive is Istio's auto mTLS: endpoints whose tlsMode is
	// istio over mTLS, the others in plain text.
	MTLSModePermissive
	// MTLSModeDisable reaches every endpoint in plain text (Istio: tls
	// mode DISABLE).
	MTLSModeDisable
)

// AnnotationMTLSMode, on a Kubernetes Service or an Istio ServiceEntry,
// sets the service's MTLSMode (STRICT, PERMISSIVE or DISABLE). It is
// Estuary's, not Istio's: Istio says this in a DestinationRule, which
// Estuary does not read, and has no Service annotation for it.
const AnnotationMTLSMode = "estuary.io/mtls-mode"

var mtlsModeNames = [...]string{MTLSModeUnset: "", MTLSModeStrict: "STRICT", MTLSModePermissive: "PERMISSIVE", MTLSModeDisable: "DISABLE"}

func (m MTLSMode) String() string {
	if m >= 0 && int(m) < len(mtlsModeNames) {
		return mtlsModeNames[m]
	}
	return fmt.Sprintf("MTLSMode(%d)", int(m))
}

// ParseMTLSMode accepts STRICT, PERMISSIVE and DISABLE, as plugins.hcl
// spells the mesh's mode, and "" for unset.
func ParseMTLSMode(s string) (MTLSMode, error) {
	for i, n := range mtlsModeNames {
		if s == n {
			return MTLSMode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown mTLS mode %q (want STRICT, PERMISSIVE or DISABLE)", s)
}

// MarshalText renders STRICT, PERMISSIVE, DISABLE, or "" when unset.
func (m MTLSMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// Health of an endpoint.
type Health int

const (
	HealthHealthy Health = iota
	HealthUnhealthy
	HealthDraining
)

func (h Health) String() string {
	switch h {
	case HealthUnhealthy:
		return "UNHEALTHY"
	case HealthDraining:
		return "DRAINING"
	}
	return "HEALTHY"
}

// Port is one port of a service.
type Port struct {
	// Name of the port, for example "http".
	Name string `json:"name"`
	// Number clients connect to.
	Number uint32 `json:"number"`
	// Protocol in Istio's spelling: HTTP, HTTP2, GRPC, TCP, TLS, HTTPS, ...
	Protocol string `json:"protocol"`
}

// Service is a named set of ports reached at one hostname. Within an
// instance, a service is keyed by its Hostname.
type Service struct {
	Hostname  string `json:"hostname"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Ports     []Port `json:"ports"`
	// VIPs are the virtual IPs per cluster ID.
	VIPs map[string][]string `json:"vips,omitempty"`
	// ExternalAddresses per cluster ID: LoadBalancer ingress IPs or hostnames,
	// externalIPs.
	ExternalAddresses map[string][]string `json:"external_addresses,omitempty"`
	// NodePorts per cluster ID: service port number to node port.
	NodePorts    map[string]map[uint32]uint32 `json:"node_ports,omitempty"`
	Labels       map[string]string            `json:"labels,omitempty"`
	Resolution   Resolution                   `json:"resolution"`
	MeshExternal bool                         `json:"mesh_external"`
	// ExportTo lists namespaces the service is visible in: empty or "*" for
	// all, "." for its own.
	ExportTo []string `json:"export_to,omitempty"`
	// SubjectAltNames are identities a client accepts from the endpoints'
	// certificates besides their service accounts' (a ServiceEntry's
	// subjectAltNames).
	SubjectAltNames []string `json:"subject_alt_names,omitempty"`
	// MTLSMode overrides the mesh's workload mTLS mode for this service
	// only; MTLSModeSource says where the plugin read it (for example
	// "annotation estuary.io/mtls-mode"), which `estuary explain` shows.
	MTLSMode       MTLSMode `json:"mtls_mode,omitempty"`
	MTLSModeSource string   `json:"mtls_mode_source,omitempty"`
	// ClusterLocal confines this instance's endpoints of the service to
	// clients of the instance's cluster (those whose CLUSTER_ID names
	// it). Kubernetes MCS uses it for cluster.local when only
	// clusterset.local spans clusters.
	ClusterLocal bool `json:"cluster_local,omitempty"`
	// LocalityFailover overrides the mesh's locality_failover for this
	// service; the zero value follows the mesh.
	LocalityFailover LocalityFailover `json:"locality_failover,omitempty"`
}

// LocalityFailover is a service's choice about locality failover:
// whether clients get its endpoints in priorities by how near each
// locality is to their own, as Istio's locality failover orders them.
type LocalityFailover int

const (
	// LocalityFailoverMesh follows mesh.locality_failover.
	LocalityFailoverMesh LocalityFailover = iota
	// LocalityFailoverOn orders this service's endpoints by locality.
	LocalityFailoverOn
	// LocalityFailoverOff sends this service's endpoints in one priority.
	LocalityFailoverOff
)

// LocalityFailoverOf reads the bool an operator writes (a static
// attribute, an annotation): nil follows the mesh.
func LocalityFailoverOf(on *bool) LocalityFailover {
	switch {
	case on == nil:
		return LocalityFailoverMesh
	case *on:
		return LocalityFailoverOn
	}
	return LocalityFailoverOff
}

// AnnotationLocalityFailover, on a Kubernetes Service or an Istio
// ServiceEntry, sets the service's LocalityFailover: "true" or "false".
// It is Estuary's, not Istio's: Istio says this in a DestinationRule's
// trafficPolicy.loadBalancer.localityLbSetting, which Estuary does not
// read, and has no Service annotation for it.
const AnnotationLocalityFailover = "estuary.io/locality-failover"

// ParseLocalityFailover reads an annotation's or a meta value: "true" or
// "false", nothing else, so a typo is reported instead of read as false.
func ParseLocalityFailover(s string) (LocalityFailover, error) {
	switch s {
	case "true":
		return LocalityFailoverOn, nil
	case "false":
		return LocalityFailoverOff, nil
	}
	return LocalityFailoverMesh, fmt.Errorf("locality failover %q is not \"true\" or \"false\"", s)
}

// Enabled resolves the choice against the mesh's default.
func (f LocalityFailover) Enabled(mesh bool) bool {
	switch f {
	case LocalityFailoverOn:
		return true
	case LocalityFailoverOff:
		return false
	}
	return mesh
}

func (f LocalityFailover) String() string {
	switch f {
	case LocalityFailoverOn:
		return "on"
	case LocalityFailoverOff:
		return "off"
	}
	return "mesh"
}

// MarshalText renders mesh, on or off.
func (f LocalityFailover) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// Equal reports whether two services carry the same data.
func (s *Service) Equal(o *Service) bool {
	return s.Hostname == o.Hostname && s.Namespace == o.Namespace && s.Name == o.Name &&
		slices.Equal(s.Ports, o.Ports) &&
		maps.EqualFunc(s.VIPs, o.VIPs, slices.Equal) &&
		maps.EqualFunc(s.ExternalAddresses, o.ExternalAddresses, slices.Equal) &&
		maps.EqualFunc(s.NodePorts, o.NodePorts, maps.Equal) &&
		maps.Equal(s.Labels, o.Labels) &&
		s.Resolution == o.Resolution && s.MeshExternal == o.MeshExternal &&
		slices.Equal(s.ExportTo, o.ExportTo) && slices.Equal(s.SubjectAltNames, o.SubjectAltNames) &&
		s.MTLSMode == o.MTLSMode && s.MTLSModeSource == o.MTLSModeSource &&
		s.ClusterLocal == o.ClusterLocal &&
		s.LocalityFailover == o.LocalityFailover
}

// Locality is where a workload runs.
type Locality struct {
	Region, Zone, Subzone string
}

// ParseLocality parses "region/zone/subzone"; missing parts stay empty.
func ParseLocality(s string) Locality {
	var l Locality
	parts := strings.SplitN(s, "/", 3)
	l.Region = parts[0]
	if len(parts) > 1 {
		l.Zone = parts[1]
	}
	if len(parts) > 2 {
		l.Subzone = parts[2]
	}
	return l
}

// String renders "region/zone/subzone", trimming empty trailing parts.
func (l Locality) String() string {
	switch {
	case l.Subzone != "":
		return l.Region + "/" + l.Zone + "/" + l.Subzone
	case l.Zone != "":
		return l.Region + "/" + l.Zone
	}
	return l.Region
}

// Endpoint is one address that serves a service.
type Endpoint struct {
	// Address is an IP, a DNS name (DNS resolution) or a "unix://" path.
	// Empty, with Network set, is a network-only endpoint (as Istio allows
	// in a ServiceEntry or WorkloadEntry): reachable only through its
	// network's gateway, so the host sends it to clients on other networks
	// as that gateway and to nobody else.
	Address string `json:"address"`
	// AdditionalAddresses are the workload's other IPs (a dual-stack pod's
	// second address family): still one endpoint, counted once in load
	// balancing. Address alone decides the endpoint's network.
	AdditionalAddresses []string `json:"additional_addresses,omitempty"`
	// TargetPorts maps a service port name to the port the endpoint listens
	// on; a port absent here is served on the service port's number.
	TargetPorts map[string]uint32 `json:"target_ports,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// Network is the endpoint's own network; empty defers to the instance
	// default and then to the host's networks config.
	Network  string   `json:"network,omitempty"`
	Locality Locality `json:"locality"`
	// Weight for load balancing; 0 means unset.
	Weight         uint32  `json:"weight"`
	TLSMode        TLSMode `json:"tls_mode"`
	ServiceAccount string  `json:"service_account,omitempty"`
	Health         Health  `json:"health"`
	// WorkloadName names the workload (pod, WorkloadEntry), for debugging.
	WorkloadName string `json:"workload_name,omitempty"`
}

// Equal reports whether two endpoints carry the same data.
func (e *Endpoint) Equal(o *Endpoint) bool {
	return e.Address == o.Address && e.Network == o.Network && e.Locality == o.Locality &&
		e.Weight == o.Weight && e.TLSMode == o.TLSMode && e.ServiceAccount == o.ServiceAccount &&
		e.Health == o.Health && e.WorkloadName == o.WorkloadName &&
		maps.Equal(e.TargetPorts, o.TargetPorts) && maps.Equal(e.Labels, o.Labels) &&
		slices.Equal(e.AdditionalAddresses, o.AdditionalAddresses)
}

// NetworkGateway is an east-west gateway into a network.
type NetworkGateway struct {
	Network string `json:"network"`
	Cluster string `json:"cluster"`
	// Address is an IP or a DNS name (resolved by the host).
	Address  string   `json:"address"`
	Port     uint32   `json:"port"`
	Locality Locality `json:"locality"`
}

// InstanceHealth is an instance's connection to its source.
type InstanceHealth struct {
	// Healthy is false while the source cannot be reached or refuses access.
	// The host keeps the last-known state either way.
	Healthy bool `json:"healthy"`
	// Message says why, for operators.
	Message string `json:"message,omitempty"`
	// Notices list problems with single objects that did not stop the
	// instance (a rejected object, a dropped gateway node).
	Notices []Notice `json:"notices,omitempty"`
}

// Notice is a problem with one object of an instance's source.
type Notice struct {
	// Subject names the object, e.g. "file se.yaml, document 2".
	Subject string `json:"subject"`
	// Message says what is wrong, with the field path where there is one.
	Message string `json:"message"`
}

// Equal reports whether two healths carry the same data.
func (h *InstanceHealth) Equal(o *InstanceHealth) bool {
	return h.Healthy == o.Healthy && h.Message == o.Message && slices.Equal(h.Notices, o.Notices)
}

// MarshalText renders the locality as "region/zone/subzone".
func (l Locality) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText parses "region/zone/subzone".
func (l *Locality) UnmarshalText(b []byte) error {
	*l = ParseLocality(string(b))
	return nil
}

// MarshalText renders the resolution in Istio's spelling.
func (r Resolution) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// MarshalText renders "istio" or "disabled".
func (m TLSMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// MarshalText renders HEALTHY, UNHEALTHY or DRAINING.
func (h Health) MarshalText() ([]byte, error) { return []byte(h.String()), nil }
