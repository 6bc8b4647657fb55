package xdsload

import (
	"unicode/utf8"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// responseCodec is the clients' gRPC codec. It decodes discovery
// responses into the same messages gRPC's protobuf codec would, but with
// every resource's value pointing into one copy of the response rather
// than copied into a buffer of its own, and type URLs the client knows
// shared rather than allocated. A CDS response of 1,000 clusters is then
// one allocation instead of thousands: the generator shares the machine
// with the server it measures, and its decoding is not what a benchmark
// should time. A response with a field it does not expect is decoded by
// protobuf itself, so the result never differs.
type responseCodec struct{}

func (responseCodec) Name() string { return grpcproto.Name }

func (responseCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
}

func (responseCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *discoveryv3.DiscoveryResponse:
		b := data.Materialize()
		if decodeSotW(b, m) {
			return nil
		}
		proto.Reset(m)
		return proto.Unmarshal(b, m)
	case *discoveryv3.DeltaDiscoveryResponse:
		b := data.Materialize()
		if decodeDelta(b, m) {
			return nil
		}
		proto.Reset(m)
		return proto.Unmarshal(b, m)
	}
	return encoding.GetCodecV2(grpcproto.Name).Unmarshal(data, v)
}

// Field numbers of the discovery messages (envoy/service/discovery/v3)
// and of google.protobuf.Any that the codec decodes by hand, from their
// descriptors.
var (
	sotwVersion, sotwResources, sotwTypeURL, sotwNonce = fieldNums(&discoveryv3.DiscoveryResponse{},
		"version_info", "resources", "type_url", "nonce")
	deltaVersion, deltaResources, deltaTypeURL, deltaNonce = fieldNums(&discoveryv3.DeltaDiscoveryResponse{},
		"system_version_info", "resources", "type_url", "nonce")
	deltaRemoved, _, _, _                         = fieldNums(&discoveryv3.DeltaDiscoveryResponse{}, "removed_resources", "", "", "")
	resourceAny, resourceVersion, resourceName, _ = fieldNums(&discoveryv3.Resource{}, "resource", "version", "name", "")
	anyTypeURL, anyValue, _, _                    = fieldNums(&anypb.Any{}, "type_url", "value", "", "")
)

// fieldNums returns the numbers of m's fields by name; "" gives -1.
func fieldNums(m proto.Message, names ...string) (a, b, c, d protowire.Number) {
	fs := m.ProtoReflect().Descriptor().Fields()
	out := [4]protowire.Number{-1, -1, -1, -1}
	for i, n := range names {
		if n != "" {
			out[i] = fs.ByName(protoreflect.Name(n)).Number()
		}
	}
	return out[0], out[1], out[2], out[3]
}

// eachField calls fn with the number and bytes of every field of b. It
// returns false if b holds a field that is not length-delimited (a
// varint, a group), is malformed, or if fn returns false.
func eachField(b []byte, fn func(num protowire.Number, v []byte) bool) bool {
	for len(b) > 0 {
		num, typ, tn := protowire.ConsumeTag(b)
		if tn < 0 || typ != protowire.BytesType {
			return false
		}
		v, vn := protowire.ConsumeBytes(b[tn:])
		if vn < 0 || !fn(num, v) {
			return false
		}
		b = b[tn+vn:]
	}
	return true
}

// str is a proto3 string field's value; ok is false if it is not UTF-8,
// which protobuf rejects.
func str(b []byte) (string, bool) {
	switch string(b) { // no allocation to compare
	case resourcev3.ClusterType:
		return resourcev3.ClusterType, true
	case resourcev3.EndpointType:
		return resourcev3.EndpointType, true
	}
	if !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

// count returns how many fields num b holds.
func count(b []byte, num protowire.Number) (n int, ok bool) {
	ok = eachField(b, func(f protowire.Number, _ []byte) bool {
		if f == num {
			n++
		}
		return true
	})
	return n, ok
}

// decodeAny fills a from b, its value pointing into b.
func decodeAny(b []byte, a *anypb.Any) bool {
	return eachField(b, func(num protowire.Number, v []byte) (ok bool) {
		switch num {
		case anyTypeURL:
			a.TypeUrl, ok = str(v)
		case anyValue:
			a.Value, ok = v[:len(v):len(v)], true
		}
		return ok
	})
}

func decodeSotW(b []byte, m *discoveryv3.DiscoveryResponse) bool {
	n, ok := count(b, sotwResources)
	if !ok {
		return false
	}
	anys := make([]anypb.Any, n)
	m.Resources = make([]*anypb.Any, 0, n)
	return eachField(b, func(num protowire.Number, v []byte) (ok bool) {
		switch num {
		case sotwVersion:
			m.VersionInfo, ok = str(v)
		case sotwTypeURL:
			m.TypeUrl, ok = str(v)
		case sotwNonce:
			m.Nonce, ok = str(v)
		case sotwResources:
			a := &anys[len(m.Resources)]
			m.Resources = append(m.Resources, a)
			ok = decodeAny(v, a)
		}
		return ok
	})
}

func decodeDelta(b []byte, m *discoveryv3.DeltaDiscoveryResponse) bool {
	n, ok := count(b, deltaResources)
	if !ok {
		return false
	}
	rs := make([]discoveryv3.Resource, n)
	anys := make([]anypb.Any, n)
	m.Resources = make([]*discoveryv3.Resource, 0, n)
	return eachField(b, func(num protowire.Number, v []byte) (ok bool) {
		switch num {
		case deltaVersion:
			m.SystemVersionInfo, ok = str(v)
		case deltaTypeURL:
			m.TypeUrl, ok = str(v)
		case deltaNonce:
			m.Nonce, ok = str(v)
		case deltaRemoved:
			var r string
			r, ok = str(v)
			m.RemovedResources = append(m.RemovedResources, r)
		case deltaResources:
			i := len(m.Resources)
			m.Resources = append(m.Resources, &rs[i])
			ok = decodeResource(v, &rs[i], &anys[i])
		}
		return ok
	})
}

func decodeResource(b []byte, r *discoveryv3.Resource, a *anypb.Any) bool {
	return eachField(b, func(num protowire.Number, v []byte) (ok bool) {
		switch num {
		case resourceAny:
			// A message field given twice merges: left to protobuf.
			ok = r.Resource == nil && decodeAny(v, a)
			r.Resource = a
		case resourceVersion:
			r.Version, ok = str(v)
		case resourceName:
			r.Name, ok = str(v)
		}
		return ok
	})
}
