package sdk

import (
	"maps"
	"reflect"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk/internal/wire"
)

// Conversions between SDK types and the wire. Unexported: plugin authors
// never see generated types.

func (id InstanceID) toProto() *registryv1.InstanceID {
	return &registryv1.InstanceID{Provider: id.Provider, Cluster: id.Cluster}
}

func (s *Service) toProto() *registryv1.Service {
	ports := make([]*registryv1.Port, len(s.Ports))
	for i, p := range s.Ports {
		ports[i] = &registryv1.Port{Name: p.Name, Number: p.Number, Protocol: p.Protocol}
	}
	return &registryv1.Service{
		Hostname:          s.Hostname,
		Namespace:         s.Namespace,
		Name:              s.Name,
		Ports:             ports,
		Vips:              wire.ClusterAddresses(s.VIPs),
		ExternalAddresses: wire.ClusterAddresses(s.ExternalAddresses),
		NodePorts:         wire.NodePorts(s.NodePorts),
		Labels:            s.Labels,
		Resolution:        registryv1.Resolution(s.Resolution),
		MeshExternal:      s.MeshExternal,
		ExportTo:          s.ExportTo,
		SubjectAltNames:   s.SubjectAltNames,
		MtlsMode:          registryv1.MTLSMode(s.MTLSMode),
		MtlsModeSource:    s.MTLSModeSource,
		ClusterLocal:      s.ClusterLocal,
		LocalityFailover:  registryv1.LocalityFailover(s.LocalityFailover),
	}
}

// endpointsToProto converts a set, sending each distinct label map and
// target-port map once.
func endpointsToProto(hostname string, eps []Endpoint) *registryv1.EndpointsReplaced {
	out := &registryv1.EndpointsReplaced{Hostname: hostname, Endpoints: make([]*registryv1.Endpoint, len(eps))}
	backing := make([]registryv1.Endpoint, len(eps))
	var labels sharedMaps[string]
	var ports sharedMaps[uint32]
	strs := stringTable{index: map[string]uint32{}}
	var lastLoc Locality
	var lastLocRef uint32
	for i := range eps {
		e := &eps[i]
		p := &backing[i]
		p.Address = e.Address
		p.AdditionalAddresses = e.AdditionalAddresses
		p.LabelSet = labels.index(e.Labels)
		p.PortSet = ports.index(e.TargetPorts)
		p.NetworkRef = strs.ref(e.Network)
		if i == 0 || e.Locality != lastLoc {
			lastLoc, lastLocRef = e.Locality, strs.ref(e.Locality.String())
		}
		p.LocalityRef = lastLocRef
		p.ServiceAccountRef = strs.ref(e.ServiceAccount)
		p.Weight = e.Weight
		p.TlsMode = registryv1.TLSMode(e.TLSMode)
		p.Health = registryv1.Health(e.Health)
		p.WorkloadName = e.WorkloadName
		out.Endpoints[i] = p
	}
	for _, m := range labels.sets {
		out.LabelSets = append(out.LabelSets, &registryv1.StringMap{Entries: m})
	}
	for _, m := range ports.sets {
		out.PortSets = append(out.PortSets, &registryv1.PortMap{Entries: m})
	}
	out.Strings = strs.values
	return out
}

// stringTable numbers the distinct strings of a set; "" is never stored
// (reference 0).
type stringTable struct {
	index  map[string]uint32
	values []string
	last   string
	ref0   uint32
}

func (t *stringTable) ref(s string) uint32 {
	if s == "" {
		return 0
	}
	if s == t.last && t.ref0 != 0 {
		return t.ref0
	}
	r, ok := t.index[s]
	if !ok {
		t.values = append(t.values, s)
		r = uint32(len(t.values))
		t.index[s] = r
	}
	t.last, t.ref0 = s, r
	return r
}

// sharedMaps numbers the distinct maps of a set. Endpoints of one workload
// usually share one map value, so a pointer match on the last few maps
// finds nearly all repeats; equal maps at other addresses are compared.
type sharedMaps[V comparable] struct {
	sets []map[string]V
}

func (s *sharedMaps[V]) index(m map[string]V) uint32 {
	if len(m) == 0 {
		return 0
	}
	for i := len(s.sets) - 1; i >= 0 && i >= len(s.sets)-8; i-- {
		if sameMap(s.sets[i], m) || maps.Equal(s.sets[i], m) {
			return uint32(i + 1)
		}
	}
	s.sets = append(s.sets, m)
	return uint32(len(s.sets))
}

// sameMap reports whether a and b are the same map value.
func sameMap[V any](a, b map[string]V) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func gatewaysToProto(gws []NetworkGateway) []*registryv1.NetworkGateway {
	out := make([]*registryv1.NetworkGateway, len(gws))
	for i, g := range gws {
		out[i] = &registryv1.NetworkGateway{Network: g.Network, Cluster: g.Cluster, Address: g.Address, Port: g.Port, Locality: g.Locality.String()}
	}
	return out
}

func (e *event) toProto() *registryv1.Event {
	pe := &registryv1.Event{Instance: e.id.toProto()}
	switch e.kind {
	case kindInstanceAdded:
		pe.Kind = &registryv1.Event_InstanceAdded{InstanceAdded: &registryv1.InstanceAdded{Properties: &registryv1.InstanceProperties{
			ClusterScoped:     e.props.ClusterScoped,
			DefaultNetwork:    e.props.DefaultNetwork,
			SyncTimeoutMillis: uint64(e.props.SyncTimeout.Milliseconds()),
		}}}
	case kindInstanceRemoved:
		pe.Kind = &registryv1.Event_InstanceRemoved{InstanceRemoved: &registryv1.InstanceRemoved{}}
	case kindServiceUpserted:
		pe.Kind = &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: e.service.toProto()}}
	case kindServiceDeleted:
		pe.Kind = &registryv1.Event_ServiceDeleted{ServiceDeleted: &registryv1.ServiceDeleted{Hostname: e.hostname}}
	case kindEndpointsReplaced:
		pe.Kind = &registryv1.Event_EndpointsReplaced{EndpointsReplaced: endpointsToProto(e.hostname, e.endpoints)}
	case kindGatewaysReplaced:
		pe.Kind = &registryv1.Event_GatewaysReplaced{GatewaysReplaced: &registryv1.GatewaysReplaced{Gateways: gatewaysToProto(e.gateways)}}
	case kindInstanceSynced:
		pe.Kind = &registryv1.Event_InstanceSynced{InstanceSynced: &registryv1.InstanceSynced{}}
	case kindInstanceHealth:
		pe.Kind = &registryv1.Event_InstanceHealth{InstanceHealth: healthToProto(e.health)}
	}
	return pe
}

func healthToProto(h *InstanceHealth) *registryv1.InstanceHealth {
	out := &registryv1.InstanceHealth{Healthy: h.Healthy, Message: h.Message}
	for _, n := range h.Notices {
		out.Notices = append(out.Notices, &registryv1.Notice{Subject: n.Subject, Message: n.Message})
	}
	return out
}

func schemaToProto(s *Schema) *registryv1.Schema {
	if s == nil {
		return nil
	}
	out := &registryv1.Schema{}
	for _, a := range s.Attributes {
		out.Attributes = append(out.Attributes, &registryv1.Attribute{Name: a.Name, Type: a.Type, Required: a.Required, Description: a.Description, Sensitive: a.Sensitive})
	}
	for _, b := range s.Blocks {
		nesting := registryv1.Nesting_NESTING_LIST
		if b.Single {
			nesting = registryv1.Nesting_NESTING_SINGLE
		}
		out.Blocks = append(out.Blocks, &registryv1.Block{TypeName: b.TypeName, Labels: b.Labels, Nesting: nesting, Body: schemaToProto(&b.Body), Description: b.Description})
	}
	return out
}
