package sdktest

import (
	"strings"
	"testing"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
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
			{Kind: &registryv1.Event_InstanceSynced{InstanceSynced: &registryv1.InstanceSynced{}}}}}}, "no instance identity"},
		{"event before its instance", []*registryv1.WatchResponse{{Sequence: 1, Snapshot: true, SnapshotDone: true, Events: []*registryv1.Event{svc}}}, "before it was added"},
		{"endpoints of an unknown service", []*registryv1.WatchResponse{snapshot, {Sequence: 2, Events: []*registryv1.Event{
			{Instance: id, Kind: &registryv1.Event_EndpointsReplaced{EndpointsReplaced: &registryv1.EndpointsReplaced{Hostname: "x.y"}}}}}}, "unknown service"},
		{"service without hostname", []*registryv1.WatchResponse{{Sequence: 1, Snapshot: true, SnapshotDone: true, Events: []*registryv1.Event{added,
			{Instance: id, Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: &registryv1.Service{}}}}}}}, "without hostname"},
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
		})
	}
	// A well-formed stream passes.
	r := NewReplica()
	if err := r.Apply(snapshot); err != nil || !r.SnapshotDone || r.Instance("P", "c").Services["a.b"] == nil {
		t.Errorf("valid snapshot: err %v, replica %s", err, r)
	}
}
