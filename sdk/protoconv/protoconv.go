// Package protoconv converts wire types of the registry protocol into the
// SDK's types. Hosts and test harnesses use it; plugin authors never need it.
package protoconv

import (
	"time"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/internal/wire"
)

// Service converts a wire service into the SDK type.
func Service(p *registryv1.Service) *sdk.Service {
	s := &sdk.Service{
		Hostname:          p.GetHostname(),
		Namespace:         p.GetNamespace(),
		Name:              p.GetName(),
		VIPs:              wire.ClusterAddressesMap(p.GetVips()),
		ExternalAddresses: wire.ClusterAddressesMap(p.GetExternalAddresses()),
		NodePorts:         wire.NodePortsMap(p.GetNodePorts()),
		Labels:            p.GetLabels(),
		Resolution:        sdk.Resolution(p.GetResolution()),
		MeshExternal:      p.GetMeshExternal(),
		ExportTo:          p.GetExportTo(),
	}
	for _, pp := range p.GetPorts() {
		s.Ports = append(s.Ports, sdk.Port{Name: pp.GetName(), Number: pp.GetNumber(), Protocol: pp.GetProtocol()})
	}
	return s
}

// Endpoints converts an endpoint set, resolving shared label and port sets.
func Endpoints(m *registryv1.EndpointsReplaced) []sdk.Endpoint {
	out := make([]sdk.Endpoint, len(m.GetEndpoints()))
	for i, p := range m.GetEndpoints() {
		out[i] = sdk.Endpoint{
			Address:        p.GetAddress(),
			TargetPorts:    p.GetTargetPorts(),
			Labels:         p.GetLabels(),
			Network:        p.GetNetwork(),
			Locality:       sdk.ParseLocality(p.GetLocality()),
			Weight:         p.GetWeight(),
			TLSMode:        sdk.TLSMode(p.GetTlsMode()),
			ServiceAccount: p.GetServiceAccount(),
			Health:         sdk.Health(p.GetHealth()),
			WorkloadName:   p.GetWorkloadName(),
		}
		if n := p.GetLabelSet(); n > 0 && int(n) <= len(m.GetLabelSets()) {
			out[i].Labels = m.GetLabelSets()[n-1].GetEntries()
		}
		if n := p.GetPortSet(); n > 0 && int(n) <= len(m.GetPortSets()) {
			out[i].TargetPorts = m.GetPortSets()[n-1].GetEntries()
		}
		strs := m.GetStrings()
		if n := p.GetNetworkRef(); n > 0 && int(n) <= len(strs) {
			out[i].Network = strs[n-1]
		}
		if n := p.GetLocalityRef(); n > 0 && int(n) <= len(strs) {
			out[i].Locality = sdk.ParseLocality(strs[n-1])
		}
		if n := p.GetServiceAccountRef(); n > 0 && int(n) <= len(strs) {
			out[i].ServiceAccount = strs[n-1]
		}
	}
	return out
}

// Gateway converts a wire gateway.
func Gateway(g *registryv1.NetworkGateway) sdk.NetworkGateway {
	return sdk.NetworkGateway{Network: g.GetNetwork(), Cluster: g.GetCluster(), Address: g.GetAddress(), Port: g.GetPort(), Locality: sdk.ParseLocality(g.GetLocality())}
}

// Health converts a wire instance health.
func Health(p *registryv1.InstanceHealth) *sdk.InstanceHealth {
	h := &sdk.InstanceHealth{Healthy: p.GetHealthy(), Message: p.GetMessage()}
	for _, n := range p.GetNotices() {
		h.Notices = append(h.Notices, sdk.Notice{Subject: n.GetSubject(), Message: n.GetMessage()})
	}
	return h
}

// Properties converts wire instance properties.
func Properties(p *registryv1.InstanceProperties) sdk.InstanceProperties {
	return sdk.InstanceProperties{
		ClusterScoped:  p.GetClusterScoped(),
		DefaultNetwork: p.GetDefaultNetwork(),
		SyncTimeout:    time.Duration(p.GetSyncTimeoutMillis()) * time.Millisecond,
	}
}
