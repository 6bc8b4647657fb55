package sdktest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/pluginclient"
)

// TestReplicaCatchesViolations: the checks the conformance suite relies on
// reject each way a plugin can break the protocol.
func TestReplicaCatchesViolations(t *testing.T) {
	id := &registryv1.InstanceID{Provider: "P", Cluster: "c"}
	added := &registryv1.Event{Instance: id, Kind: &registryv1.Event_InstanceAdded{InstanceAdded: &registryv1.InstanceAdded{}}}
	svc := &registryv1.Event{Instance: id, Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: &registryv1.Service{Hostname: "a.b"}}}}
	snapshot := &registryv1.WatchResponse{Sequence: 1, Snapshot: true, SnapshotDone: true, Events: []*registryv1.Event{added, svc}}
	tests := []struct {
		name      string
		responses []*registryv1.WatchResponse
		want      string
	}{
		{"sequence gap", []*registryv1.WatchResponse{snapshot, {Sequence: 3}}, "sequence 3 follows 1"},
		{"sequence not starting at 1", []*registryv1.WatchResponse{{Sequence: 2, Snapshot: true, SnapshotDone: true}}, "sequence 2 follows 0"},
		{"delta before the snapshot is done", []*registryv1.WatchResponse{{Sequence: 1}}, "not marked snapshot"},
		{"snapshot flag after the snapshot", []*registryv1.WatchResponse{snapshot, {Sequence: 2, Snapshot: true}}, "after the snapshot was done"},
		{"event without identity", []*registryv1.WatchResponse{{Sequence: 1, Snapshot: true, SnapshotDone: true, Events: []*registryv1.Event{
			{Kind: &registryv1.Event_InstanceSynced{InstanceSynced: &registryv1.InstanceSynced{}}}}}}, `event 0 (instance_synced, instance "/"): the event has no instance identity`},
		{"event before its instance", []*registryv1.WatchResponse{{Sequence: 1, Snapshot: true, SnapshotDone: true, Events: []*registryv1.Event{svc}}}, `event 0 (service_upserted, instance "P/c"): the instance was never added`},
		{"endpoints of an unknown service", []*registryv1.WatchResponse{snapshot, {Sequence: 2, Events: []*registryv1.Event{
			{Instance: id, Kind: &registryv1.Event_EndpointsReplaced{EndpointsReplaced: &registryv1.EndpointsReplaced{Hostname: "x.y"}}}}}}, `event 0 (endpoints_replaced, instance "P/c"): endpoints for service "x.y", which the instance has not upserted`},
		{"service without hostname", []*registryv1.WatchResponse{{Sequence: 1, Snapshot: true, SnapshotDone: true, Events: []*registryv1.Event{added,
			{Instance: id, Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: &registryv1.Service{}}}}}}}, `event 1 (service_upserted, instance "P/c"): the service has no hostname`},
		{"label set out of range", []*registryv1.WatchResponse{snapshot, {Sequence: 2, Events: []*registryv1.Event{
			{Instance: id, Kind: &registryv1.Event_EndpointsReplaced{EndpointsReplaced: &registryv1.EndpointsReplaced{Hostname: "a.b",
				Endpoints: []*registryv1.Endpoint{{Address: "10.0.0.1", LabelSet: 1}}}}}}}},
			`batch 2, event 0 (endpoints_replaced, instance "P/c"): endpoint 0 (10.0.0.1): label_set 1 is out of range`},
		{"string reference out of range", []*registryv1.WatchResponse{snapshot, {Sequence: 2, Events: []*registryv1.Event{
			{Instance: id, Kind: &registryv1.Event_EndpointsReplaced{EndpointsReplaced: &registryv1.EndpointsReplaced{Hostname: "a.b", Strings: []string{"n1"},
				Endpoints: []*registryv1.Endpoint{{Address: "10.0.0.1", NetworkRef: 1, LocalityRef: 2}}}}}}}},
			`batch 2, event 0 (endpoints_replaced, instance "P/c"): endpoint 0 (10.0.0.1): locality_ref 2 is out of range`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReplica()
			var err error
			for _, resp := range tt.responses {
				if err = r.Apply(resp); err != nil {
					break
				}
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want one containing %q", err, tt.want)
			}
			var perr *pluginclient.ProtocolError
			if !errors.As(err, &perr) {
				t.Errorf("error %v is not a *pluginclient.ProtocolError", err)
			}
		})
	}
	// A bad response changes nothing of the replica, even where its
	// first events were good.
	r := NewReplica()
	if err := r.Apply(snapshot); err != nil {
		t.Fatal(err)
	}
	bad := &registryv1.WatchResponse{Sequence: 2, Events: []*registryv1.Event{
		{Instance: id, Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: &registryv1.Service{Hostname: "good.b"}}}},
		{Instance: id, Kind: &registryv1.Event_EndpointsReplaced{EndpointsReplaced: &registryv1.EndpointsReplaced{Hostname: "good.b",
			Endpoints: []*registryv1.Endpoint{{Address: "10.0.0.1", PortSet: 4}}}}},
	}}
	if err := r.Apply(bad); err == nil {
		t.Errorf("a response with an out-of-range port set was accepted")
	}
	if r.Instance("P", "c").Services["good.b"] != nil {
		t.Errorf("the good half of a bad response was applied")
	}

	// A well-formed stream passes.
	r = NewReplica()
	if err := r.Apply(snapshot); err != nil || !r.SnapshotDone || r.Instance("P", "c").Services["a.b"] == nil {
		t.Errorf("valid snapshot: err %v, replica %s", err, r)
	}
}

// undeclared is a plugin that reports what its capabilities do not allow:
// gateways without CAPABILITY_GATEWAYS, or two instances without
// CAPABILITY_MULTI_INSTANCE.
type undeclared struct {
	state *sdk.State
	what  string
}

func (p *undeclared) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Name: "undeclared", Version: "1", Capabilities: []sdk.Capability{sdk.CapabilityReconfigure}}, nil
}

func (p *undeclared) Configure(context.Context, *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	id := sdk.InstanceID{Provider: "P", Cluster: "c1"}
	p.state.SetInstance(id, sdk.InstanceProperties{})
	switch p.what {
	case "gateways":
		if err := p.state.SetGateways(id, []sdk.NetworkGateway{{Network: "n1", Address: "1.1.1.1", Port: 15443}}); err != nil {
			return nil, err
		}
	case "instances":
		p.state.SetInstance(sdk.InstanceID{Provider: "P", Cluster: "c2"}, sdk.InstanceProperties{})
	}
	return &sdk.ConfigureResponse{}, p.state.MarkSynced(id)
}

// TestWatcherHoldsPluginToItsCapabilities: the suite's watcher, which reads
// the stream through the host's plugin client, catches events that need a
// capability the plugin did not declare, and names the event.
func TestWatcherHoldsPluginToItsCapabilities(t *testing.T) {
	tests := []struct{ what, want string }{
		{"gateways", `event 1 (gateways_replaced, instance "P/c1"): gateways need capability GATEWAYS, which the plugin did not declare`},
		{"instances", `(instance_added, instance "P/c2"): a second instance needs capability MULTI_INSTANCE`},
	}
	for _, tt := range tests {
		t.Run(tt.what, func(t *testing.T) {
			h := Start(t, func(rt sdk.Runtime) sdk.Plugin { return &undeclared{state: rt.State, what: tt.what} })
			h.Configure(t, "", sdk.MeshSettings{})
			w := h.Watch(t)
			w.waitEnded(t, 10*time.Second)
			err := w.Err()
			var perr *pluginclient.ProtocolError
			if !errors.As(err, &perr) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("stream error = %v, want a protocol error containing %q", err, tt.want)
			}
			w.With(func(r *Replica) {
				if len(r.Instances) != 0 {
					t.Errorf("the bad snapshot was applied: %s", r)
				}
			})
		})
	}
}
