package xds

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestSharedCodecRoundTrips: what the xDS server's codec writes decodes,
// with gRPC's own protobuf codec, to the message it was given, for State
// of the World and Delta responses with every kind of field set; and a
// large resource's bytes are sent in place, not copied.
func TestSharedCodecRoundTrips(t *testing.T) {
	big := &anypb.Any{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Value: bytes.Repeat([]byte{0x0a, 0x01, 'x'}, 400)}
	small := &anypb.Any{TypeUrl: "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", Value: []byte{0x0a, 0x01, 'y'}}
	empty := &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.Empty"}
	md, _ := structpb.NewStruct(map[string]any{"k": "v"})
	msgs := []proto.Message{
		&discoveryv3.DiscoveryResponse{
			VersionInfo: "7", TypeUrl: big.TypeUrl, Nonce: "42", Canary: true,
			ControlPlane: &corev3.ControlPlane{Identifier: "estuary"},
			Resources:    append([]*anypb.Any{big, small, empty}, repeatAny(big, minFramed/len(big.Value)+1)...),
		},
		&discoveryv3.DeltaDiscoveryResponse{
			SystemVersionInfo: "9", TypeUrl: big.TypeUrl, Nonce: "43",
			RemovedResources: []string{"gone"}, ControlPlane: &corev3.ControlPlane{Identifier: "estuary"},
			Resources: append([]*discoveryv3.Resource{
				{Name: "a", Version: "1", Resource: big, Aliases: []string{"a1"}, CacheControl: &discoveryv3.Resource_CacheControl{DoNotCache: true},
					ResourceName: &discoveryv3.ResourceName{Name: "a"}},
				{Name: "b", Version: "2", Resource: small, Ttl: durationpb.New(time.Second), Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"f": md}}},
				{Name: "c", Version: "3"}, // no resource: a heartbeat or a removal by TTL
				{Name: "d", Version: "4", Resource: empty},
			}, bigResources(big, minFramed/len(big.Value)+1)...),
		},
	}
	c := newSharedCodec()
	for _, m := range msgs {
		data, err := c.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		shared := false
		for _, b := range data {
			if d := b.ReadOnlyData(); len(d) == len(big.Value) && &d[0] == &big.Value[0] {
				shared = true
			}
		}
		if !shared {
			t.Errorf("%T: the large resource's bytes were copied, not sent in place", m)
		}
		got := m.ProtoReflect().New().Interface()
		if err := c.Unmarshal(data, got); err != nil {
			t.Fatalf("%T: the codec's bytes do not decode: %v", m, err)
		}
		if !proto.Equal(got, m) {
			t.Errorf("%T decodes to\n%v\nwant\n%v", m, got, m)
		}
		want, _ := proto.Marshal(m)
		if n := data.Len(); n != len(want) {
			t.Errorf("%T: %d bytes, protobuf's encoding has %d", m, n, len(want))
		}
		data.Free()
	}
	// Other messages, and responses it does not frame (empty, or smaller
	// than minFramed), go to gRPC's codec.
	for _, m := range []proto.Message{&discoveryv3.DiscoveryRequest{VersionInfo: "1"}, &discoveryv3.DiscoveryResponse{VersionInfo: "1"},
		&discoveryv3.DiscoveryResponse{VersionInfo: "1", Resources: []*anypb.Any{big, small}}} {
		data, err := c.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := proto.Marshal(m)
		if !bytes.Equal(data.Materialize(), want) {
			t.Errorf("%T: not protobuf's own encoding", m)
		}
		data.Free()
	}
}

// TestSharedCodecKnowsResourceFields: resourceHeader copies every field of
// a Delta Resource but its Any; a field go-control-plane adds would be
// dropped from every Delta response, so it must be added there.
func TestSharedCodecKnowsResourceFields(t *testing.T) {
	known := map[string]bool{"name": true, "resource_name": true, "aliases": true, "version": true,
		"resource": true, "ttl": true, "cache_control": true, "metadata": true}
	fields := (&discoveryv3.Resource{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		if name := string(fields.Get(i).Name()); !known[name] {
			t.Errorf("envoy.service.discovery.v3.Resource has field %q, which resourceHeader does not copy", name)
		}
	}
	if fields.Len() != len(known) {
		t.Errorf("Resource has %d fields, resourceHeader knows %d", fields.Len(), len(known))
	}
}

func repeatAny(a *anypb.Any, n int) []*anypb.Any {
	out := make([]*anypb.Any, n)
	for i := range out {
		out[i] = a
	}
	return out
}

func bigResources(a *anypb.Any, n int) []*discoveryv3.Resource {
	out := make([]*discoveryv3.Resource, n)
	for i := range out {
		out[i] = &discoveryv3.Resource{Name: fmt.Sprintf("r%d", i), Version: "1", Resource: a}
	}
	return out
}
