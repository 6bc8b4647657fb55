package kubernetes

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	kubeclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Pods are read straight into podInfo. A cluster has ten times more pods
// than anything else the plugin reads, and a Pod, with its managed fields,
// containers and status, is over 1 KB of protobuf of which the plugin keeps
// a name, labels, a node and a service account. Decoding whole Pods only to
// drop them in the transform was most of the plugin's CPU (and of its
// garbage) during a cold sync of 100,000 pods; the decoder below reads the
// few fields podInfo holds and skips the rest of each message unparsed.
//
// Only the objects go through it: watch event frames, Status responses and
// anything but Pod and PodList are decoded by client-go's own serializers.
// A JSON answer (protobuf is asked for, JSON accepted) is decoded into a
// Pod by client-go and then cut down, as before.

// fullPodDecode makes the pod informer decode whole Pods and cut them down
// in the transform, as the plugin did before podInfo was decoded directly.
// Only BenchmarkColdSync sets it, to compare both in one run.
var fullPodDecode = false

// podInfoList is the list type of the pod informer.
type podInfoList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []podInfo
}

// DeepCopyObject implements runtime.Object.
func (l *podInfoList) DeepCopyObject() runtime.Object {
	out := &podInfoList{TypeMeta: l.TypeMeta, Items: make([]podInfo, len(l.Items))}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	for i := range l.Items {
		out.Items[i] = *l.Items[i].DeepCopyObject().(*podInfo)
	}
	return out
}

// newPodInformer returns the informer factory's builder of the pod
// informer: a ListWatch on a REST client of its own, whose decoder makes
// podInfos.
func newPodInformer(rc *rest.Config, hc *http.Client) (func(kubeclient.Interface, time.Duration) cache.SharedIndexInformer, error) {
	rc = rest.CopyConfig(rc)
	rc.APIPath = "/api"
	rc.GroupVersion = &corev1.SchemeGroupVersion
	rc.NegotiatedSerializer = podSerializer{base: scheme.Codecs.WithoutConversion()}
	client, err := rest.RESTClientForConfigAndClient(rc, hc)
	if err != nil {
		return nil, fmt.Errorf("pod client: %w", err)
	}
	return func(_ kubeclient.Interface, resync time.Duration) cache.SharedIndexInformer {
		lw := cache.NewFilteredListWatchFromClient(client, "pods", metav1.NamespaceAll, func(*metav1.ListOptions) {})
		if !podWatchList {
			lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				// The newest state (a consistent read, served from the
				// API server's watch cache), in pages: never older than
				// what the reflector asked for, and a page's worth of
				// response held at a time instead of all the pods.
				o.ResourceVersion, o.ResourceVersionMatch, o.Limit = "", "", podPageSize
				// Compressed, as client-go asks by default: even on
				// loopback, pages asked for uncompressed cost the API
				// server more (BenchmarkColdSync, 6.1-6.8 s of CPU per
				// sync against 4.2-4.8 s with gzip).
				return client.Get().Resource("pods").VersionedParams(&o, metav1.ParameterCodec).Do(ctx).Get()
			}
		}
		var plw cache.ListerWatcher = lw
		if !podWatchList {
			plw = pagedListWatch{lw}
		}
		return cache.NewSharedIndexInformer(plw, &podInfo{}, resync, cache.Indexers{})
	}, nil
}

// Pods are listed in pages rather than streamed with client-go's watch
// list. Streaming sends every pod as a watch event of its own, and for a
// cold sync of 100,000 pods on 2 cores that cost the API server 7.2 s of
// CPU against 4.1-6.7 s for pages of a list (BenchmarkColdSync, variants
// pods-watchlist and after). Lists in pages keep the memory of watch list's: one page
// in flight, where a single list would hold all 100,000 pods' response.
var podPageSize int64 = 5000 // a variable for TestPodsListedInPages

// podWatchList makes the pod informer use client-go's watch list (when the
// WatchListClient feature is on, as by default). Only BenchmarkColdSync
// sets it, to compare both in one run.
var podWatchList = false

// pagedListWatch opts a ListWatch out of client-go's watch list: its
// reflector lists, then watches.
type pagedListWatch struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported is what client-go's reflector asks.
func (pagedListWatch) IsWatchListSemanticsUnSupported() bool { return true }

// podSerializer is client-go's serializer with the object decoder of every
// media type replaced by a podDecoder.
type podSerializer struct{ base runtime.NegotiatedSerializer }

func (s podSerializer) SupportedMediaTypes() []runtime.SerializerInfo {
	infos := s.base.SupportedMediaTypes()
	out := make([]runtime.SerializerInfo, len(infos))
	for i, info := range infos {
		info.Serializer = podDecoder{Serializer: info.Serializer, protobuf: info.MediaType == runtime.ContentTypeProtobuf}
		out[i] = info
	}
	return out
}

func (s podSerializer) EncoderForVersion(e runtime.Encoder, gv runtime.GroupVersioner) runtime.Encoder {
	return s.base.EncoderForVersion(e, gv)
}

func (s podSerializer) DecoderToVersion(d runtime.Decoder, gv runtime.GroupVersioner) runtime.Decoder {
	return s.base.DecoderToVersion(d, gv)
}

// podDecoder decodes Pods into podInfos and PodLists into podInfoLists,
// and anything else as the serializer it wraps does.
type podDecoder struct {
	runtime.Serializer
	protobuf bool
}

var protobufPrefix = []byte{'k', '8', 's', 0} // what the API server's protobuf starts with

func (d podDecoder) Decode(data []byte, defaults *kschema.GroupVersionKind, into runtime.Object) (runtime.Object, *kschema.GroupVersionKind, error) {
	switch into.(type) {
	case nil, *podInfo, *podInfoList:
	default:
		return d.Serializer.Decode(data, defaults, into)
	}
	if d.protobuf && bytes.HasPrefix(data, protobufPrefix) {
		gvk, raw, err := protoEnvelope(data[len(protobufPrefix):])
		if err != nil {
			return nil, nil, err
		}
		if gvk.Group == "" && gvk.Version == "v1" {
			switch gvk.Kind {
			case "Pod":
				p := &podInfo{}
				if err := p.unmarshal(raw); err != nil {
					return nil, nil, fmt.Errorf("decode Pod: %w", err)
				}
				return p, &gvk, nil
			case "PodList":
				l := &podInfoList{}
				if err := l.unmarshal(raw); err != nil {
					return nil, nil, fmt.Errorf("decode PodList: %w", err)
				}
				return l, &gvk, nil
			}
		}
	}
	obj, gvk, err := d.Serializer.Decode(data, defaults, nil)
	if err != nil {
		return nil, nil, err
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		end, ok := o.Annotations[metav1.InitialEventsAnnotationKey]
		p, _ := transformPod(o)
		if ok { // the reflector reads it after this decoder, before the transform
			p.(*podInfo).Annotations = map[string]string{metav1.InitialEventsAnnotationKey: end}
		}
		return p.(*podInfo), gvk, nil
	case *corev1.PodList:
		l := &podInfoList{ListMeta: o.ListMeta, Items: make([]podInfo, len(o.Items))}
		for i := range o.Items {
			p, _ := transformPod(&o.Items[i])
			l.Items[i] = *p.(*podInfo)
		}
		return l, gvk, nil
	}
	return obj, gvk, nil
}

// protoEnvelope reads a runtime.Unknown: the object's kind and its bytes.
func protoEnvelope(b []byte) (kschema.GroupVersionKind, []byte, error) {
	var (
		tm  []byte
		raw []byte
	)
	err := eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			tm = v
		case 2:
			raw = v
		}
		return nil
	})
	if err != nil {
		return kschema.GroupVersionKind{}, nil, fmt.Errorf("decode protobuf envelope: %w", err)
	}
	var apiVersion, kind string
	err = eachField(tm, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			apiVersion = string(v)
		case 2:
			kind = string(v)
		}
		return nil
	})
	if err != nil {
		return kschema.GroupVersionKind{}, nil, fmt.Errorf("decode protobuf envelope: %w", err)
	}
	return kschema.FromAPIVersionAndKind(apiVersion, kind), raw, nil
}

// unmarshal reads a Pod message: its metadata, spec.serviceAccountName
// and spec.nodeName.
func (p *podInfo) unmarshal(b []byte) error {
	return eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1: // metadata
			return unmarshalMeta(&p.ObjectMeta, v)
		case 2: // spec
			return eachField(v, func(num protowire.Number, v []byte) error {
				switch num {
				case 8:
					p.ServiceAccount = string(v)
				case 10:
					p.NodeName = string(v)
				}
				return nil
			})
		}
		return nil
	})
}

// unmarshalMeta reads what slimMeta keeps of an ObjectMeta message, and of
// the annotations only the one that ends a watch list's initial events.
func unmarshalMeta(m *metav1.ObjectMeta, b []byte) error {
	return eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			m.Name = string(v)
		case 3:
			m.Namespace = string(v)
		case 5:
			m.UID = types.UID(v)
		case 6:
			m.ResourceVersion = string(v)
		case 11, 12:
			var key, value []byte
			err := eachField(v, func(num protowire.Number, v []byte) error {
				switch num {
				case 1:
					key = v
				case 2:
					value = v
				}
				return nil
			})
			if err != nil {
				return err
			}
			if num == 11 {
				if m.Labels == nil {
					m.Labels = map[string]string{}
				}
				m.Labels[string(key)] = string(value)
			} else if string(key) == metav1.InitialEventsAnnotationKey {
				m.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: string(value)}
			}
		}
		return nil
	})
}

// unmarshal reads a PodList message.
func (l *podInfoList) unmarshal(b []byte) error {
	n := 0
	err := eachField(b, func(num protowire.Number, _ []byte) error {
		if num == 2 {
			n++
		}
		return nil
	})
	if err != nil {
		return err
	}
	l.Items = make([]podInfo, 0, n)
	return eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1: // metadata
			return eachField(v, func(num protowire.Number, v []byte) error {
				switch num {
				case 2:
					l.ResourceVersion = string(v)
				case 3:
					l.Continue = string(v)
				case 4:
					n, k := protowire.ConsumeVarint(v)
					if k < 0 {
						return protowire.ParseError(k)
					}
					c := int64(n)
					l.RemainingItemCount = &c
				}
				return nil
			})
		case 2: // items
			l.Items = append(l.Items, podInfo{})
			return l.Items[len(l.Items)-1].unmarshal(v)
		}
		return nil
	})
}

// eachField calls f with the number and value of each field of a protobuf
// message: the bytes of a length-delimited field, the varint's bytes of a
// varint. Other wire types are skipped, as no field read here has one.
func eachField(b []byte, f func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			_, n = protowire.ConsumeVarint(b)
			if n >= 0 {
				v = b[:n]
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if v != nil {
			if err := f(num, v); err != nil {
				return err
			}
		}
	}
	return nil
}
