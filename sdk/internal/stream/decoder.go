package stream

import (
	"fmt"
	"time"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/internal/wire"
)

// Decoder validates and decodes the responses of one Watch stream, in
// order. What it checks:
//
//   - sequence numbers start at 1 and grow by one;
//   - every response is marked snapshot until one is marked snapshot_done,
//     and none is marked either after it;
//   - every event names its instance (provider and cluster) and has a kind;
//   - an instance is added before any other event of it, and not used after
//     it is removed (until it is added again);
//   - an upserted service has a hostname, and endpoints are replaced only
//     for a service upserted earlier on the stream (and not deleted since);
//   - every shared-table reference of an endpoint (label_set, port_set,
//     network_ref, locality_ref, service_account_ref) is in range;
//   - events that need a capability come only from a plugin that declared
//     it: gateways need GATEWAYS, a second instance at a time needs
//     MULTI_INSTANCE, instance_set_complete needs INSTANCE_SET;
//   - instance_set_complete comes once per stream, on the snapshot_done
//     response or a later one.
//
// For a plugin that did not declare INSTANCE_SET, the snapshot_done batch
// is decoded with InstanceSetComplete set, as the protocol says.
//
// The first violation ends the stream: Decode returns it then and on every
// later call, because what follows a bad batch cannot be trusted either.
type Decoder struct {
	gateways, multiInstance, instanceSet bool

	seq          uint64
	snapshotDone bool
	setComplete  bool
	instances    map[sdk.InstanceID]*instance
	err          *ProtocolError
}

// instance is what the decoder remembers of an instance to check the events
// that follow: the services it holds on this stream.
type instance struct {
	services map[string]struct{}
}

// NewDecoder starts decoding a stream from a plugin that declared caps.
func NewDecoder(caps []sdk.Capability) *Decoder {
	d := &Decoder{instances: map[sdk.InstanceID]*instance{}}
	for _, c := range caps {
		switch c {
		case sdk.CapabilityGateways:
			d.gateways = true
		case sdk.CapabilityMultiInstance:
			d.multiInstance = true
		case sdk.CapabilityInstanceSet:
			d.instanceSet = true
		}
	}
	return d
}

// Decode checks one response against the protocol and what came before it
// on the stream, and decodes it. It returns the whole batch or, if any part
// of the response breaks the protocol, a *ProtocolError and no batch.
func (d *Decoder) Decode(resp *registryv1.WatchResponse) (*Batch, error) {
	if d.err != nil {
		return nil, d.err
	}
	b, err := d.decode(resp)
	if err != nil {
		d.err = err
		return nil, err
	}
	return b, nil
}

func (d *Decoder) decode(resp *registryv1.WatchResponse) (*Batch, *ProtocolError) {
	seq := resp.GetSequence()
	batchErr := func(format string, args ...any) *ProtocolError {
		return &ProtocolError{Sequence: seq, Event: -1, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case seq != d.seq+1:
		return nil, batchErr("sequence %d follows %d; want %d", seq, d.seq, d.seq+1)
	case !d.snapshotDone && !resp.GetSnapshot():
		return nil, batchErr("not marked snapshot, but the snapshot is not done")
	case d.snapshotDone && (resp.GetSnapshot() || resp.GetSnapshotDone()):
		return nil, batchErr("marked snapshot after the snapshot was done")
	case resp.GetInstanceSetComplete() && !d.instanceSet:
		return nil, batchErr("instance_set_complete needs capability %s, which the plugin did not declare", sdk.CapabilityInstanceSet)
	case resp.GetInstanceSetComplete() && d.setComplete:
		return nil, batchErr("instance_set_complete sent a second time on the stream")
	case resp.GetInstanceSetComplete() && !d.snapshotDone && !resp.GetSnapshotDone():
		return nil, batchErr("instance_set_complete before the snapshot is done")
	}
	d.seq = seq
	b := &Batch{Sequence: seq, Snapshot: resp.GetSnapshot(), SnapshotDone: resp.GetSnapshotDone(),
		InstanceSetComplete: resp.GetInstanceSetComplete() || (resp.GetSnapshotDone() && !d.instanceSet)}
	if evs := resp.GetEvents(); len(evs) > 0 {
		b.Events = make([]Event, len(evs))
		for i, pe := range evs {
			if reason := d.event(pe, &b.Events[i]); reason != "" {
				return nil, &ProtocolError{Sequence: seq, Event: i, Kind: b.Events[i].Kind, Instance: b.Events[i].Instance, Reason: reason}
			}
		}
	}
	if h := resp.GetPluginHealth(); h != nil {
		b.PluginHealth = decodeHealth(h)
	}
	if b.SnapshotDone {
		d.snapshotDone = true
	}
	if b.InstanceSetComplete {
		d.setComplete = true
	}
	return b, nil
}

// event checks and decodes one event into ev. It returns why the event
// breaks the protocol, or "". ev's Kind and Instance are set first, so the
// caller can name the event either way.
func (d *Decoder) event(pe *registryv1.Event, ev *Event) string {
	ev.Instance = sdk.InstanceID{Provider: pe.GetInstance().GetProvider(), Cluster: pe.GetInstance().GetCluster()}
	ev.Kind = kindOf(pe)
	if ev.Kind == 0 {
		return "the event has no kind this protocol version knows"
	}
	if ev.Instance.Provider == "" || ev.Instance.Cluster == "" {
		return "the event has no instance identity (provider and cluster must both be set)"
	}
	in := d.instances[ev.Instance]
	if ev.Kind == KindInstanceAdded {
		if in == nil {
			if len(d.instances) > 0 && !d.multiInstance {
				return fmt.Sprintf("a second instance needs capability %s, which the plugin did not declare (it already has %s)",
					sdk.CapabilityMultiInstance, d.anyInstance())
			}
			d.instances[ev.Instance] = &instance{services: map[string]struct{}{}}
		}
		p := pe.GetInstanceAdded().GetProperties()
		ev.Properties = sdk.InstanceProperties{
			ClusterScoped:  p.GetClusterScoped(),
			DefaultNetwork: p.GetDefaultNetwork(),
			SyncTimeout:    time.Duration(p.GetSyncTimeoutMillis()) * time.Millisecond,
		}
		return ""
	}
	if in == nil {
		return "the instance was never added, or was removed"
	}
	switch ev.Kind {
	case KindInstanceRemoved:
		delete(d.instances, ev.Instance)
	case KindServiceUpserted:
		svc := decodeService(pe.GetServiceUpserted().GetService())
		if svc.Hostname == "" {
			return "the service has no hostname"
		}
		if svc.MTLSMode < sdk.MTLSModeUnset || svc.MTLSMode > sdk.MTLSModeDisable {
			return fmt.Sprintf("service %q: mtls_mode %d is not one this protocol version knows", svc.Hostname, svc.MTLSMode)
		}
		in.services[svc.Hostname] = struct{}{}
		ev.Service = svc
	case KindServiceDeleted:
		ev.Hostname = pe.GetServiceDeleted().GetHostname()
		delete(in.services, ev.Hostname)
	case KindEndpointsReplaced:
		m := pe.GetEndpointsReplaced()
		ev.Hostname = m.GetHostname()
		if _, ok := in.services[ev.Hostname]; !ok {
			return fmt.Sprintf("endpoints for service %q, which the instance has not upserted", ev.Hostname)
		}
		set, reason := decodeEndpoints(m)
		if reason != "" {
			return reason
		}
		ev.Endpoints = set
	case KindGatewaysReplaced:
		if !d.gateways {
			return fmt.Sprintf("gateways need capability %s, which the plugin did not declare", sdk.CapabilityGateways)
		}
		gws := pe.GetGatewaysReplaced().GetGateways()
		ev.Gateways = make([]sdk.NetworkGateway, len(gws))
		for i, g := range gws {
			ev.Gateways[i] = sdk.NetworkGateway{Network: g.GetNetwork(), Cluster: g.GetCluster(), Address: g.GetAddress(), Port: g.GetPort(), Locality: sdk.ParseLocality(g.GetLocality())}
		}
	case KindInstanceSynced:
	case KindInstanceHealth:
		ev.Health = decodeHealth(pe.GetInstanceHealth())
	}
	return ""
}

func decodeHealth(h *registryv1.InstanceHealth) *sdk.InstanceHealth {
	out := &sdk.InstanceHealth{Healthy: h.GetHealthy(), Message: h.GetMessage()}
	if ns := h.GetNotices(); len(ns) > 0 {
		out.Notices = make([]sdk.Notice, len(ns))
		for i, n := range ns {
			out.Notices[i] = sdk.Notice{Subject: n.GetSubject(), Message: n.GetMessage()}
		}
	}
	return out
}

// anyInstance names an instance the stream holds, for an error message.
func (d *Decoder) anyInstance() string {
	for id := range d.instances {
		return fmt.Sprintf("%q", id.String())
	}
	return "none"
}

func kindOf(pe *registryv1.Event) Kind {
	switch pe.GetKind().(type) {
	case *registryv1.Event_InstanceAdded:
		return KindInstanceAdded
	case *registryv1.Event_InstanceRemoved:
		return KindInstanceRemoved
	case *registryv1.Event_ServiceUpserted:
		return KindServiceUpserted
	case *registryv1.Event_ServiceDeleted:
		return KindServiceDeleted
	case *registryv1.Event_EndpointsReplaced:
		return KindEndpointsReplaced
	case *registryv1.Event_GatewaysReplaced:
		return KindGatewaysReplaced
	case *registryv1.Event_InstanceSynced:
		return KindInstanceSynced
	case *registryv1.Event_InstanceHealth:
		return KindInstanceHealth
	}
	return 0
}

func decodeService(p *registryv1.Service) *sdk.Service {
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
		SubjectAltNames:   p.GetSubjectAltNames(),
		MTLSMode:          sdk.MTLSMode(p.GetMtlsMode()),
		MTLSModeSource:    p.GetMtlsModeSource(),
		ClusterLocal:      p.GetClusterLocal(),
		LocalityFailover:  sdk.LocalityFailover(p.GetLocalityFailover()),
	}
	if ps := p.GetPorts(); len(ps) > 0 {
		s.Ports = make([]sdk.Port, len(ps))
		for i, pp := range ps {
			s.Ports[i] = sdk.Port{Name: pp.GetName(), Number: pp.GetNumber(), Protocol: pp.GetProtocol()}
		}
	}
	return s
}
