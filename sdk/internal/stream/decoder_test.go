package stream

import (
	"errors"
	"maps"
	"reflect"
	"slices"
	"testing"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

// --- hand-built wire events of instance "P/<cluster>" ---

func pid(cluster string) *registryv1.InstanceID {
	return &registryv1.InstanceID{Provider: "P", Cluster: cluster}
}

func added(cluster string) *registryv1.Event {
	return &registryv1.Event{Instance: pid(cluster), Kind: &registryv1.Event_InstanceAdded{InstanceAdded: &registryv1.InstanceAdded{}}}
}

func removed(cluster string) *registryv1.Event {
	return &registryv1.Event{Instance: pid(cluster), Kind: &registryv1.Event_InstanceRemoved{InstanceRemoved: &registryv1.InstanceRemoved{}}}
}

func upsert(cluster, host string) *registryv1.Event {
	return &registryv1.Event{Instance: pid(cluster), Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{
		Service: &registryv1.Service{Hostname: host, Ports: []*registryv1.Port{{Name: "http", Number: 80, Protocol: "HTTP"}}}}}}
}

func deleted(cluster, host string) *registryv1.Event {
	return &registryv1.Event{Instance: pid(cluster), Kind: &registryv1.Event_ServiceDeleted{ServiceDeleted: &registryv1.ServiceDeleted{Hostname: host}}}
}

func replaced(cluster string, m *registryv1.EndpointsReplaced) *registryv1.Event {
	return &registryv1.Event{Instance: pid(cluster), Kind: &registryv1.Event_EndpointsReplaced{EndpointsReplaced: m}}
}

func endpoints(cluster, host string, eps ...*registryv1.Endpoint) *registryv1.Event {
	return replaced(cluster, &registryv1.EndpointsReplaced{Hostname: host, Endpoints: eps})
}

func gateways(cluster string, addrs ...string) *registryv1.Event {
	g := &registryv1.GatewaysReplaced{}
	for _, a := range addrs {
		g.Gateways = append(g.Gateways, &registryv1.NetworkGateway{Network: "n1", Address: a, Port: 15443})
	}
	return &registryv1.Event{Instance: pid(cluster), Kind: &registryv1.Event_GatewaysReplaced{GatewaysReplaced: g}}
}

func synced(cluster string) *registryv1.Event {
	return &registryv1.Event{Instance: pid(cluster), Kind: &registryv1.Event_InstanceSynced{InstanceSynced: &registryv1.InstanceSynced{}}}
}

func complete(r *registryv1.WatchResponse) *registryv1.WatchResponse {
	r.InstanceSetComplete = true
	return r
}

func snap(seq uint64, done bool, evs ...*registryv1.Event) *registryv1.WatchResponse {
	return &registryv1.WatchResponse{Sequence: seq, Snapshot: true, SnapshotDone: done, Events: evs}
}

func delta(seq uint64, evs ...*registryv1.Event) *registryv1.WatchResponse {
	return &registryv1.WatchResponse{Sequence: seq, Events: evs}
}

// tables builds an EndpointsReplaced of a.example.com with one label set,
// one port set and two strings, and one endpoint that refers to them
// through ep.
func tables(ep *registryv1.Endpoint) *registryv1.EndpointsReplaced {
	ep.Address = "10.0.0.1"
	return &registryv1.EndpointsReplaced{
		Hostname:  "a.example.com",
		LabelSets: []*registryv1.StringMap{{Entries: map[string]string{"app": "a"}}},
		PortSets:  []*registryv1.PortMap{{Entries: map[string]uint32{"http": 8080}}},
		Strings:   []string{"network1", "r/z"},
		Endpoints: []*registryv1.Endpoint{{Address: "10.0.0.0", LabelSet: 1, PortSet: 1, NetworkRef: 1, LocalityRef: 2}, ep},
	}
}

var (
	allCaps = []sdk.Capability{sdk.CapabilityReconfigure, sdk.CapabilityMultiInstance, sdk.CapabilityGateways}
	setCaps = append(slices.Clone(allCaps), sdk.CapabilityInstanceSet)
	// opening is a valid snapshot: instance P/c1 with service a.example.com.
	opening = func() *registryv1.WatchResponse { return snap(1, true, added("c1"), upsert("c1", "a.example.com")) }
)

// TestDecoderRules: each rule of the protocol rejects the stream that
// breaks it, with an error that names the batch and the offending event
// (index, kind, instance).
func TestDecoderRules(t *testing.T) {
	tests := []struct {
		name      string
		caps      []sdk.Capability // nil: allCaps
		responses []*registryv1.WatchResponse
		want      string
	}{
		// Sequence numbers.
		{"first sequence is not 1", nil, []*registryv1.WatchResponse{snap(2, true)},
			"protocol error in batch 2: sequence 2 follows 0; want 1"},
		{"sequence gap", nil, []*registryv1.WatchResponse{opening(), delta(3)},
			"protocol error in batch 3: sequence 3 follows 1; want 2"},
		{"sequence repeated", nil, []*registryv1.WatchResponse{opening(), delta(1)},
			"protocol error in batch 1: sequence 1 follows 1; want 2"},

		// Snapshot flags.
		{"delta as the first batch", nil, []*registryv1.WatchResponse{delta(1, added("c1"))},
			"protocol error in batch 1: not marked snapshot, but the snapshot is not done"},
		{"delta before snapshot_done", nil, []*registryv1.WatchResponse{snap(1, false, added("c1")), delta(2)},
			"protocol error in batch 2: not marked snapshot, but the snapshot is not done"},
		{"snapshot_done without snapshot", nil, []*registryv1.WatchResponse{{Sequence: 1, SnapshotDone: true}},
			"protocol error in batch 1: not marked snapshot, but the snapshot is not done"},
		{"snapshot after the snapshot", nil, []*registryv1.WatchResponse{opening(), snap(2, false)},
			"protocol error in batch 2: marked snapshot after the snapshot was done"},
		{"snapshot_done after the snapshot", nil, []*registryv1.WatchResponse{opening(), {Sequence: 2, SnapshotDone: true}},
			"protocol error in batch 2: marked snapshot after the snapshot was done"},

		// Identity and kind.
		{"event without a kind", nil, []*registryv1.WatchResponse{snap(1, true, added("c1"), &registryv1.Event{Instance: pid("c1")})},
			`protocol error in batch 1, event 1 (event without a kind, instance "P/c1"): the event has no kind this protocol version knows`},
		{"event without an instance", nil, []*registryv1.WatchResponse{snap(1, true,
			&registryv1.Event{Kind: &registryv1.Event_InstanceSynced{InstanceSynced: &registryv1.InstanceSynced{}}})},
			`protocol error in batch 1, event 0 (instance_synced, instance "/"): the event has no instance identity (provider and cluster must both be set)`},
		{"event without a cluster", nil, []*registryv1.WatchResponse{snap(1, true,
			&registryv1.Event{Instance: &registryv1.InstanceID{Provider: "P"}, Kind: &registryv1.Event_InstanceAdded{InstanceAdded: &registryv1.InstanceAdded{}}})},
			`protocol error in batch 1, event 0 (instance_added, instance "P/"): the event has no instance identity (provider and cluster must both be set)`},

		// Instances come before their events.
		{"event before its instance", nil, []*registryv1.WatchResponse{snap(1, true, added("c1"), upsert("c9", "a.example.com"))},
			`protocol error in batch 1, event 1 (service_upserted, instance "P/c9"): the instance was never added, or was removed`},
		{"event after its instance was removed", nil, []*registryv1.WatchResponse{opening(), delta(2, removed("c1"), synced("c1"))},
			`protocol error in batch 2, event 1 (instance_synced, instance "P/c1"): the instance was never added, or was removed`},
		{"removal of an instance never added", nil, []*registryv1.WatchResponse{opening(), delta(2, removed("c2"))},
			`protocol error in batch 2, event 0 (instance_removed, instance "P/c2"): the instance was never added, or was removed`},

		// Services.
		{"service without hostname", nil, []*registryv1.WatchResponse{snap(1, true, added("c1"), upsert("c1", ""))},
			`protocol error in batch 1, event 1 (service_upserted, instance "P/c1"): the service has no hostname`},
		{"service_upserted without a service", nil, []*registryv1.WatchResponse{snap(1, true, added("c1"),
			&registryv1.Event{Instance: pid("c1"), Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{}}})},
			`protocol error in batch 1, event 1 (service_upserted, instance "P/c1"): the service has no hostname`},
		{"service with an mtls_mode from a later protocol", nil, []*registryv1.WatchResponse{snap(1, true, added("c1"),
			&registryv1.Event{Instance: pid("c1"), Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{
				Service: &registryv1.Service{Hostname: "a.example.com", MtlsMode: 9}}}})},
			`protocol error in batch 1, event 1 (service_upserted, instance "P/c1"): service "a.example.com": mtls_mode 9 is not one this protocol version knows`},
		{"endpoints of a service never upserted", nil, []*registryv1.WatchResponse{opening(), delta(2, endpoints("c1", "b.example.com"))},
			`protocol error in batch 2, event 0 (endpoints_replaced, instance "P/c1"): endpoints for service "b.example.com", which the instance has not upserted`},
		{"endpoints of a deleted service", nil, []*registryv1.WatchResponse{opening(), delta(2, deleted("c1", "a.example.com"), endpoints("c1", "a.example.com"))},
			`protocol error in batch 2, event 1 (endpoints_replaced, instance "P/c1"): endpoints for service "a.example.com", which the instance has not upserted`},
		{"endpoints of another instance's service", nil, []*registryv1.WatchResponse{opening(), delta(2, added("c2"), endpoints("c2", "a.example.com"))},
			`protocol error in batch 2, event 1 (endpoints_replaced, instance "P/c2"): endpoints for service "a.example.com", which the instance has not upserted`},
		{"endpoints of an instance removed and added again", nil, []*registryv1.WatchResponse{opening(), delta(2, removed("c1"), added("c1"), endpoints("c1", "a.example.com"))},
			`protocol error in batch 2, event 2 (endpoints_replaced, instance "P/c1"): endpoints for service "a.example.com", which the instance has not upserted`},

		// Shared tables of EndpointsReplaced.
		{"label_set out of range", nil, []*registryv1.WatchResponse{opening(), delta(2, replaced("c1", tables(&registryv1.Endpoint{LabelSet: 2})))},
			`protocol error in batch 2, event 0 (endpoints_replaced, instance "P/c1"): endpoint 1 (10.0.0.1): label_set 2 is out of range: the event has 1 label sets`},
		{"port_set out of range", nil, []*registryv1.WatchResponse{opening(), delta(2, replaced("c1", tables(&registryv1.Endpoint{PortSet: 2})))},
			`protocol error in batch 2, event 0 (endpoints_replaced, instance "P/c1"): endpoint 1 (10.0.0.1): port_set 2 is out of range: the event has 1 port sets`},
		{"network_ref out of range", nil, []*registryv1.WatchResponse{opening(), delta(2, replaced("c1", tables(&registryv1.Endpoint{NetworkRef: 3})))},
			`protocol error in batch 2, event 0 (endpoints_replaced, instance "P/c1"): endpoint 1 (10.0.0.1): network_ref 3 is out of range: the event has 2 strings`},
		{"locality_ref out of range", nil, []*registryv1.WatchResponse{opening(), delta(2, replaced("c1", tables(&registryv1.Endpoint{LocalityRef: 3})))},
			`protocol error in batch 2, event 0 (endpoints_replaced, instance "P/c1"): endpoint 1 (10.0.0.1): locality_ref 3 is out of range: the event has 2 strings`},
		{"service_account_ref out of range", nil, []*registryv1.WatchResponse{opening(), delta(2, replaced("c1", tables(&registryv1.Endpoint{ServiceAccountRef: 7})))},
			`protocol error in batch 2, event 0 (endpoints_replaced, instance "P/c1"): endpoint 1 (10.0.0.1): service_account_ref 7 is out of range: the event has 2 strings`},
		{"reference into empty tables", nil, []*registryv1.WatchResponse{opening(), delta(2, endpoints("c1", "a.example.com", &registryv1.Endpoint{Address: "10.0.0.1", LabelSet: 1}))},
			`protocol error in batch 2, event 0 (endpoints_replaced, instance "P/c1"): endpoint 0 (10.0.0.1): label_set 1 is out of range: the event has 0 label sets`},

		// Capabilities.
		{"gateways without GATEWAYS", []sdk.Capability{sdk.CapabilityReconfigure, sdk.CapabilityMultiInstance},
			[]*registryv1.WatchResponse{snap(1, true, added("c1"), gateways("c1", "1.1.1.1"))},
			`protocol error in batch 1, event 1 (gateways_replaced, instance "P/c1"): gateways need capability GATEWAYS, which the plugin did not declare`},
		{"empty gateways without GATEWAYS", []sdk.Capability{},
			[]*registryv1.WatchResponse{opening(), delta(2, gateways("c1"))},
			`protocol error in batch 2, event 0 (gateways_replaced, instance "P/c1"): gateways need capability GATEWAYS, which the plugin did not declare`},
		{"second instance without MULTI_INSTANCE", []sdk.Capability{sdk.CapabilityGateways},
			[]*registryv1.WatchResponse{opening(), delta(2, synced("c1"), added("c2"))},
			`protocol error in batch 2, event 1 (instance_added, instance "P/c2"): a second instance needs capability MULTI_INSTANCE, which the plugin did not declare (it already has "P/c1")`},

		// The instance set.
		{"instance_set_complete without INSTANCE_SET", nil,
			[]*registryv1.WatchResponse{opening(), complete(delta(2))},
			`protocol error in batch 2: instance_set_complete needs capability INSTANCE_SET, which the plugin did not declare`},
		{"instance_set_complete twice", setCaps,
			[]*registryv1.WatchResponse{complete(opening()), complete(delta(2))},
			`protocol error in batch 2: instance_set_complete sent a second time on the stream`},
		{"instance_set_complete before snapshot_done", setCaps,
			[]*registryv1.WatchResponse{complete(snap(1, false, added("c1")))},
			`protocol error in batch 1: instance_set_complete before the snapshot is done`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps := tt.caps
			if caps == nil {
				caps = allCaps
			}
			d := NewDecoder(caps)
			var err error
			last := len(tt.responses) - 1
			for i, resp := range tt.responses {
				var b *Batch
				b, err = d.Decode(resp)
				if i < last && err != nil {
					t.Fatalf("response %d (valid) rejected: %v", i, err)
				}
				if i == last && b != nil {
					t.Errorf("the bad response was returned (%d events) beside its error", len(b.Events))
				}
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("error:\n got %v\nwant %s", err, tt.want)
			}
			var perr *ProtocolError
			if !errors.As(err, &perr) || perr.Sequence != tt.responses[last].GetSequence() {
				t.Errorf("error %#v is not a *ProtocolError of batch %d", err, tt.responses[last].GetSequence())
			}
			// The stream is over: nothing after a violation is trusted.
			if _, again := d.Decode(delta(tt.responses[last].GetSequence() + 1)); again != err {
				t.Errorf("after the violation, Decode returned %v, want the same error", again)
			}
		})
	}
}

// TestDecoderAccepts: streams that keep the rules decode, including the
// edges of each rule.
func TestDecoderAccepts(t *testing.T) {
	tests := []struct {
		name      string
		caps      []sdk.Capability
		responses []*registryv1.WatchResponse
	}{
		{"empty snapshot", nil, []*registryv1.WatchResponse{snap(1, true)}},
		{"snapshot over three batches, then deltas", nil, []*registryv1.WatchResponse{
			snap(1, false, added("c1")), snap(2, false, upsert("c1", "a.example.com")), snap(3, true, synced("c1")),
			delta(4, endpoints("c1", "a.example.com")), delta(5),
		}},
		{"references at the end of each table", nil, []*registryv1.WatchResponse{opening(),
			delta(2, replaced("c1", tables(&registryv1.Endpoint{LabelSet: 1, PortSet: 1, NetworkRef: 2, LocalityRef: 2, ServiceAccountRef: 2})))}},
		{"a service upserted again after its deletion", nil, []*registryv1.WatchResponse{opening(),
			delta(2, deleted("c1", "a.example.com"), upsert("c1", "a.example.com"), endpoints("c1", "a.example.com"))}},
		{"deletion of an unknown service", nil, []*registryv1.WatchResponse{opening(), delta(2, deleted("c1", "z.example.com"))}},
		{"instance added twice (new properties)", nil, []*registryv1.WatchResponse{opening(), delta(2, added("c1"), endpoints("c1", "a.example.com"))}},
		{"one instance at a time without MULTI_INSTANCE", []sdk.Capability{}, []*registryv1.WatchResponse{opening(), delta(2, removed("c1"), added("c2"))}},
		{"gateways and instances with their capabilities", allCaps, []*registryv1.WatchResponse{opening(), delta(2, gateways("c1", "1.1.1.1"), added("c2"), gateways("c2"))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(tt.caps)
			for i, resp := range tt.responses {
				b, err := d.Decode(resp)
				if err != nil {
					t.Fatalf("response %d: %v", i, err)
				}
				if len(b.Events) != len(resp.GetEvents()) || b.Sequence != resp.GetSequence() ||
					b.Snapshot != resp.GetSnapshot() || b.SnapshotDone != resp.GetSnapshotDone() {
					t.Errorf("response %d decoded as %+v", i, b)
				}
			}
		})
	}
}

// TestDecoderInstanceSet: the batch that completes the instance set is
// the one carrying instance_set_complete for a plugin with INSTANCE_SET,
// and the snapshot_done one for a plugin without it.
func TestDecoderInstanceSet(t *testing.T) {
	tests := []struct {
		name      string
		caps      []sdk.Capability
		responses []*registryv1.WatchResponse
		want      uint64 // the sequence of the completing batch; 0: none
	}{
		{"without INSTANCE_SET: snapshot_done completes", allCaps,
			[]*registryv1.WatchResponse{snap(1, false, added("c1")), snap(2, true), delta(3)}, 2},
		{"INSTANCE_SET, not sent", setCaps, []*registryv1.WatchResponse{opening(), delta(2)}, 0},
		{"INSTANCE_SET, with snapshot_done", setCaps, []*registryv1.WatchResponse{complete(opening()), delta(2)}, 1},
		{"INSTANCE_SET, after discovery", setCaps, []*registryv1.WatchResponse{opening(), delta(2, added("c2")), complete(delta(3)), delta(4)}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(tt.caps)
			var got uint64
			for i, resp := range tt.responses {
				b, err := d.Decode(resp)
				if err != nil {
					t.Fatalf("response %d: %v", i, err)
				}
				if b.InstanceSetComplete {
					if got != 0 {
						t.Fatalf("batches %d and %d both complete the instance set", got, b.Sequence)
					}
					got = b.Sequence
				}
			}
			if got != tt.want {
				t.Errorf("instance set completed by batch %d, want %d", got, tt.want)
			}
		})
	}
}

// TestDecodeEvents checks what each kind of event decodes to.
func TestDecodeEvents(t *testing.T) {
	health := &registryv1.Event{Instance: pid("c1"), Kind: &registryv1.Event_InstanceHealth{InstanceHealth: &registryv1.InstanceHealth{
		Healthy: false, Message: "down", Notices: []*registryv1.Notice{{Subject: "s", Message: "m"}}}}}
	withProps := &registryv1.Event{Instance: pid("c1"), Kind: &registryv1.Event_InstanceAdded{InstanceAdded: &registryv1.InstanceAdded{
		Properties: &registryv1.InstanceProperties{ClusterScoped: true, DefaultNetwork: "n1", SyncTimeoutMillis: 1500}}}}
	svc := &registryv1.Event{Instance: pid("c1"), Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: &registryv1.Service{
		Hostname: "a.example.com", Namespace: "ns", Name: "a", Ports: []*registryv1.Port{{Name: "http", Number: 80, Protocol: "HTTP"}},
		Vips: []*registryv1.ClusterAddresses{{Cluster: "c1", Addresses: []string{"10.96.0.1"}}}, Resolution: registryv1.Resolution_RESOLUTION_DNS,
		NodePorts: []*registryv1.ClusterNodePorts{{Cluster: "c1", Ports: map[uint32]uint32{80: 30080}}}, ExportTo: []string{"."}, SubjectAltNames: []string{"spiffe://td/ns/a/sa/b"},
		MtlsMode: registryv1.MTLSMode_MTLS_MODE_DISABLE, MtlsModeSource: "annotation x",
		LocalityFailover: registryv1.LocalityFailover_LOCALITY_FAILOVER_OFF,
	}}}}
	eps := tables(&registryv1.Endpoint{Labels: map[string]string{"inline": "yes"}, TargetPorts: map[string]uint32{"http": 9090},
		Network: "n2", Locality: "r/z2", ServiceAccount: "sa", Weight: 3, TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO, Health: registryv1.Health_HEALTH_DRAINING, WorkloadName: "w"})

	d := NewDecoder(allCaps)
	b, err := d.Decode(snap(1, true, withProps, svc, replaced("c1", eps), gateways("c1", "1.1.1.1"), health, synced("c1")))
	if err != nil {
		t.Fatal(err)
	}
	id := sdk.InstanceID{Provider: "P", Cluster: "c1"}
	want := []Event{
		{Kind: KindInstanceAdded, Instance: id, Properties: sdk.InstanceProperties{ClusterScoped: true, DefaultNetwork: "n1", SyncTimeout: 1500_000_000}},
		{Kind: KindServiceUpserted, Instance: id, Service: &sdk.Service{Hostname: "a.example.com", Namespace: "ns", Name: "a",
			Ports: []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}}, VIPs: map[string][]string{"c1": {"10.96.0.1"}},
			NodePorts: map[string]map[uint32]uint32{"c1": {80: 30080}}, Resolution: sdk.ResolutionDNS, ExportTo: []string{"."}, SubjectAltNames: []string{"spiffe://td/ns/a/sa/b"},
			MTLSMode: sdk.MTLSModeDisable, MTLSModeSource: "annotation x",
			LocalityFailover: sdk.LocalityFailoverOff}},
		{Kind: KindEndpointsReplaced, Instance: id, Hostname: "a.example.com", Endpoints: &EndpointSet{Endpoints: []Endpoint{
			{Address: "10.0.0.0", Labels: map[string]string{"app": "a"}, TargetPorts: map[string]uint32{"http": 8080}, Network: "network1", Locality: "r/z"},
			{Address: "10.0.0.1", Labels: map[string]string{"inline": "yes"}, TargetPorts: map[string]uint32{"http": 9090}, Network: "n2", Locality: "r/z2",
				ServiceAccount: "sa", WorkloadName: "w", Weight: 3, TLSMode: sdk.TLSModeIstio, Health: sdk.HealthDraining},
		}}},
		{Kind: KindGatewaysReplaced, Instance: id, Gateways: []sdk.NetworkGateway{{Network: "n1", Address: "1.1.1.1", Port: 15443}}},
		{Kind: KindInstanceHealth, Instance: id, Health: &sdk.InstanceHealth{Message: "down", Notices: []sdk.Notice{{Subject: "s", Message: "m"}}}},
		{Kind: KindInstanceSynced, Instance: id},
	}
	if len(b.Events) != len(want) {
		t.Fatalf("%d events, want %d", len(b.Events), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(b.Events[i], want[i]) {
			t.Errorf("event %d (%s):\n got %+v\nwant %+v", i, want[i].Kind, b.Events[i], want[i])
		}
	}
	got := b.Events[2].Endpoints.Endpoints
	if !maps.Equal(got[0].Labels, eps.LabelSets[0].Entries) || reflect.ValueOf(got[0].Labels).UnsafePointer() != reflect.ValueOf(eps.LabelSets[0].Entries).UnsafePointer() {
		t.Errorf("an endpoint's label set is a copy, not the shared map")
	}
}
