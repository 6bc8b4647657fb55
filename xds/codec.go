package xds

import (
	"fmt"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// sharedCodec is the xDS server's gRPC codec. Every client of a view gets
// the same resources, which the cache holds marshaled once (each an Any).
// gRPC's own codec would copy them into one new buffer per response: with
// a thousand clusters, a megabyte per proxy, held until the proxy has read
// it, so a fleet connecting at once needs a megabyte per proxy of heap and
// as many copies. This codec marshals only what differs per response (the
// envelope: version, nonce, type, and each resource's framing) and hands
// gRPC the resources' own bytes, read-only, in place. Other messages go to
// gRPC's protobuf codec. The bytes on the wire are a valid encoding of the
// same message (fields may come in another order, which protobuf allows).
type sharedCodec struct {
	proto encoding.CodecV2
}

func newSharedCodec() *sharedCodec {
	return &sharedCodec{proto: encoding.GetCodecV2(grpcproto.Name)}
}

// Name is the protobuf codec's: clients see no difference.
func (c *sharedCodec) Name() string { return grpcproto.Name }

func (c *sharedCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

// minShared is the smallest resource worth sending in place; smaller ones
// are copied with the framing, which costs less than a buffer of their own.
const minShared = 256

var (
	sotwResources  = (&discoveryv3.DiscoveryResponse{}).ProtoReflect().Descriptor().Fields().ByName("resources")
	deltaResources = (&discoveryv3.DeltaDiscoveryResponse{}).ProtoReflect().Descriptor().Fields().ByName("resources")
	resourceAny    = (&discoveryv3.Resource{}).ProtoReflect().Descriptor().Fields().ByName("resource")
)

func (c *sharedCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *discoveryv3.DiscoveryResponse:
		if n, ok := plainAnys(m.GetResources()); ok && n >= minFramed {
			return marshalSotW(m)
		}
	case *discoveryv3.DeltaDiscoveryResponse:
		if n, ok := plainDelta(m.GetResources()); ok && n >= minFramed {
			return marshalDelta(m)
		}
	}
	return c.proto.Marshal(v)
}

// minFramed is the smallest response (its resources' values) this codec
// frames by hand. Below it the copy gRPC's codec makes is small and
// short-lived, and one buffer marshaled in one call costs less CPU: a push
// of one CLA to every client is such a response.
const minFramed = 32 << 10

// plainAnys reports whether every Any holds only a type and a value (no
// unknown fields), what this codec frames by hand, and their values' size.
func plainAnys(as []*anypb.Any) (int, bool) {
	n := 0
	for _, a := range as {
		if a == nil || len(a.ProtoReflect().GetUnknown()) > 0 {
			return 0, false
		}
		n += len(a.GetValue())
	}
	return n, len(as) > 0
}

// plainDelta reports whether rs are plain, and their Anys' values' size.
func plainDelta(rs []*discoveryv3.Resource) (int, bool) {
	n := 0
	for _, r := range rs {
		if r == nil || len(r.ProtoReflect().GetUnknown()) > 0 {
			return 0, false
		}
		if a := r.GetResource(); a != nil {
			size, ok := plainAnys([]*anypb.Any{a})
			if !ok {
				return 0, false
			}
			n += size
		}
	}
	return n, len(rs) > 0
}

// without returns a shallow copy of m lacking field skip; m is not
// changed (gRPC may marshal it while the cache still reads it).
func without(m proto.Message, skip protoreflect.FieldDescriptor) proto.Message {
	src := m.ProtoReflect()
	dst := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd != skip {
			dst.Set(fd, v)
		}
		return true
	})
	if u := src.GetUnknown(); len(u) > 0 {
		dst.SetUnknown(u)
	}
	return dst.Interface()
}

// resourceHeader is r without its resource: built field by field, as
// without would by reflection at five times the cost, which a Delta
// response pays per resource. TestSharedCodecKnowsResourceFields fails
// when go-control-plane's Resource gains a field this does not copy.
func resourceHeader(r *discoveryv3.Resource) *discoveryv3.Resource {
	return &discoveryv3.Resource{
		Name: r.Name, ResourceName: r.ResourceName, Aliases: r.Aliases, Version: r.Version,
		Ttl: r.Ttl, CacheControl: r.CacheControl, Metadata: r.Metadata,
	}
}

// anySize is the encoded size of a, without its own tag and length.
func anySize(a *anypb.Any) int {
	n := 0
	if tu := a.GetTypeUrl(); tu != "" {
		n += protowire.SizeTag(anyTypeURL) + protowire.SizeBytes(len(tu))
	}
	if v := a.GetValue(); len(v) > 0 {
		n += protowire.SizeTag(anyValue) + protowire.SizeBytes(len(v))
	}
	return n
}

// framer collects an encoding as small copied pieces and large shared ones.
type framer struct {
	out mem.BufferSlice
	buf []byte // the copied bytes since the last shared piece
}

// any appends a's encoding as field num (tag, length, type, value); its
// value goes in place if it is large.
func (f *framer) any(num protowire.Number, a *anypb.Any) {
	f.buf = protowire.AppendTag(f.buf, num, protowire.BytesType)
	f.buf = protowire.AppendVarint(f.buf, uint64(anySize(a)))
	f.anyBody(a)
}

func (f *framer) anyBody(a *anypb.Any) {
	if tu := a.GetTypeUrl(); tu != "" {
		f.buf = protowire.AppendTag(f.buf, anyTypeURL, protowire.BytesType)
		f.buf = protowire.AppendString(f.buf, tu)
	}
	v := a.GetValue()
	if len(v) == 0 {
		return
	}
	f.buf = protowire.AppendTag(f.buf, anyValue, protowire.BytesType)
	f.buf = protowire.AppendVarint(f.buf, uint64(len(v)))
	if len(v) < minShared {
		f.buf = append(f.buf, v...)
		return
	}
	f.flush()
	f.out = append(f.out, mem.SliceBuffer(v))
}

func (f *framer) flush() {
	if len(f.buf) > 0 {
		f.out = append(f.out, mem.SliceBuffer(f.buf))
		// Go on after it in the same array: appends write past the
		// piece handed over, never into it.
		f.buf = f.buf[len(f.buf):]
	}
}

func (f *framer) done() mem.BufferSlice {
	f.flush()
	return f.out
}

func marshalSotW(m *discoveryv3.DiscoveryResponse) (mem.BufferSlice, error) {
	head, err := proto.Marshal(without(m, sotwResources))
	if err != nil {
		return nil, fmt.Errorf("xds: marshal response: %w", err)
	}
	f := &framer{buf: make([]byte, 0, len(head)+len(m.GetResources())*96)}
	f.buf = append(f.buf, head...)
	for _, a := range m.GetResources() {
		f.any(sotwResources.Number(), a)
	}
	return f.done(), nil
}

func marshalDelta(m *discoveryv3.DeltaDiscoveryResponse) (mem.BufferSlice, error) {
	head, err := proto.Marshal(without(m, deltaResources))
	if err != nil {
		return nil, fmt.Errorf("xds: marshal delta response: %w", err)
	}
	f := &framer{buf: make([]byte, 0, len(head)+len(m.GetResources())*160)}
	f.buf = append(f.buf, head...)
	for _, r := range m.GetResources() {
		rh, err := proto.Marshal(resourceHeader(r))
		if err != nil {
			return nil, fmt.Errorf("xds: marshal delta resource %q: %w", r.GetName(), err)
		}
		size := len(rh)
		a := r.GetResource()
		if a != nil {
			size += protowire.SizeTag(resourceAny.Number()) + protowire.SizeBytes(anySize(a))
		}
		f.buf = protowire.AppendTag(f.buf, deltaResources.Number(), protowire.BytesType)
		f.buf = protowire.AppendVarint(f.buf, uint64(size))
		f.buf = append(f.buf, rh...)
		if a != nil {
			f.any(resourceAny.Number(), a)
		}
	}
	return f.done(), nil
}
