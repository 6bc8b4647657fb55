package configschema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"sync"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/estuary-mesh/estuary/sdk"
)

// blockDecoder decodes a body against one level of a schema straight into
// the JSON that ctyjson.Marshal writes for hcldec's result, block by
// block. hcldec builds one cty.List of every nested block, unifying the
// types of its elements (for a static plugin's 10,000 endpoints that, and
// cty's JSON encoding of numbers through big.Float, cost about a second
// per reload on a 2-core machine); here each block is decoded on its own
// and written as it comes. It is compiled from the hcldec spec, so both
// read a body by the same hcl.BodySchema and report the same diagnostics
// at the same positions.
type blockDecoder struct {
	schema *hcl.BodySchema
	fields []field // sorted by name: the order ctyjson writes an object in
}

type field struct {
	name string
	// One of: a block label (label >= 0), an attribute (attr set), a
	// list of nested blocks (nested set).
	label    int
	attr     *hcldec.AttrSpec
	validate func(cty.Value) hcl.Diagnostics // a ValidateSpec around attr
	nested   *blockDecoder
	typeName string // nested blocks' type
	maxItems int
}

// compile builds the decoder of spec. It returns false for a spec it
// does not know how to decode exactly as hcldec does (an attribute of
// type any, whose blocks hcldec would unify): Decode then uses hcldec.
func compile(spec hcldec.ObjectSpec) (*blockDecoder, bool) {
	d := &blockDecoder{schema: hcldec.ImpliedSchema(spec)}
	for _, name := range slices.Sorted(mapKeys(spec)) {
		f := field{name: name, label: -1}
		s := spec[name]
		if v, ok := s.(*hcldec.ValidateSpec); ok {
			f.validate = v.Func
			s = v.Wrapped
		}
		switch s := s.(type) {
		case *hcldec.BlockLabelSpec:
			f.label = s.Index
		case *hcldec.AttrSpec:
			if s.Type.HasDynamicTypes() {
				return nil, false
			}
			f.attr = s
		case *hcldec.BlockListSpec:
			nested, ok := s.Nested.(hcldec.ObjectSpec)
			if !ok || s.MinItems > 0 {
				return nil, false
			}
			if f.nested, ok = compile(nested); !ok {
				return nil, false
			}
			f.typeName, f.maxItems = s.TypeName, s.MaxItems
		default:
			return nil, false
		}
		if f.validate != nil && f.attr == nil {
			return nil, false
		}
		d.fields = append(d.fields, f)
	}
	return d, true
}

func mapKeys(spec hcldec.ObjectSpec) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range spec {
			if !yield(k) {
				return
			}
		}
	}
}

// decodeJSON is Decode with d; memo, if not nil, serves and records the
// body's first-level blocks.
func decodeJSON(d *blockDecoder, body hcl.Body, memo *memo) ([]byte, hcl.Diagnostics) {
	var buf bytes.Buffer
	diags := d.decode(body, nil, &buf, memo)
	sortByPosition(diags)
	if diags.HasErrors() {
		return nil, diags
	}
	return buf.Bytes(), diags
}

// decode writes body as a JSON object to buf. What it writes is only
// meaningful when the diagnostics hold no error.
func (d *blockDecoder) decode(body hcl.Body, labels []string, buf *bytes.Buffer, memo *memo) hcl.Diagnostics {
	content, diags := body.Content(d.schema)
	buf.WriteByte('{')
	for i := range d.fields {
		f := &d.fields[i]
		if i > 0 {
			buf.WriteByte(',')
		}
		writeString(buf, f.name)
		buf.WriteByte(':')
		switch {
		case f.label >= 0:
			if f.label < len(labels) {
				writeString(buf, labels[f.label])
			} else {
				buf.WriteString("null") // Content already reported it
			}
		case f.attr != nil:
			diags = append(diags, f.decodeAttr(content, buf)...)
		default:
			diags = append(diags, f.decodeBlocks(content, buf, memo)...)
		}
	}
	buf.WriteByte('}')
	return diags
}

// decodeAttr is hcldec's AttrSpec (and ValidateSpec) decode.
func (f *field) decodeAttr(content *hcl.BodyContent, buf *bytes.Buffer) hcl.Diagnostics {
	attr, ok := content.Attributes[f.name]
	if !ok {
		// A missing required one is reported by Content.
		buf.WriteString("null")
		if f.validate == nil {
			return nil
		}
		diags := f.validate(cty.NullVal(f.attr.Type))
		for _, d := range diags {
			if d.Subject == nil {
				d.Subject = content.MissingItemRange.Ptr()
			}
		}
		return diags
	}
	val, diags := attr.Expr.Value(nil)
	conv, err := convert.Convert(val, f.attr.Type)
	if err != nil {
		buf.WriteString("null")
		return append(diags, &hcl.Diagnostic{
			Severity:   hcl.DiagError,
			Summary:    "Incorrect attribute value type",
			Detail:     fmt.Sprintf("Inappropriate value for attribute %q: %s.", f.name, err.Error()),
			Subject:    attr.Expr.Range().Ptr(),
			Context:    hcl.RangeBetween(attr.NameRange, attr.Expr.Range()).Ptr(),
			Expression: attr.Expr,
		})
	}
	if f.validate != nil && !diags.HasErrors() {
		for _, d := range f.validate(conv) {
			if d.Subject == nil {
				d.Subject = attr.Expr.Range().Ptr()
			}
			diags = append(diags, d)
		}
	}
	if err := writeValue(buf, conv); err != nil {
		buf.WriteString("null")
		if !diags.HasErrors() {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Cannot encode config",
				Detail: fmt.Sprintf("%s: %v.", f.name, err), Subject: attr.Expr.Range().Ptr()})
		}
	}
	return diags
}

// decodeBlocks is hcldec's BlockListSpec decode, without the list. With
// a memo, a block whose source text it holds is not decoded again.
func (f *field) decodeBlocks(content *hcl.BodyContent, buf *bytes.Buffer, memo *memo) hcl.Diagnostics {
	var diags hcl.Diagnostics
	buf.WriteByte('[')
	n := 0
	var extra hcl.Range
	for _, b := range content.Blocks {
		if b.Type != f.typeName {
			continue
		}
		if n > 0 {
			buf.WriteByte(',')
		}
		key, cacheable := memo.key(f.typeName, b)
		if js, ok := memo.get(key, cacheable); ok {
			buf.Write(js)
		} else {
			start := buf.Len()
			d := f.nested.decode(b.Body, b.Labels, buf, nil)
			if len(d) == 0 && cacheable {
				memo.put(key, buf.Bytes()[start:])
			}
			diags = append(diags, d...)
		}
		if n == f.maxItems {
			extra = b.Body.MissingItemRange()
		}
		n++
	}
	buf.WriteByte(']')
	if f.maxItems > 0 && n > f.maxItems {
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  fmt.Sprintf("Too many %s blocks", f.typeName),
			Detail:   fmt.Sprintf("No more than %d %q blocks are allowed", f.maxItems, f.typeName),
			Subject:  &extra,
		})
	}
	return diags
}

// writeValue writes v as ctyjson.Marshal does for its own type, but
// whole numbers without big.Float's formatting.
func writeValue(buf *bytes.Buffer, v cty.Value) error {
	if !v.IsKnown() {
		return fmt.Errorf("value is not known")
	}
	if v.IsNull() {
		buf.WriteString("null")
		return nil
	}
	ty := v.Type()
	switch {
	case ty == cty.String:
		writeString(buf, v.AsString())
	case ty == cty.Number:
		return writeNumber(buf, v)
	case ty == cty.Bool:
		buf.WriteString(strconv.FormatBool(v.True()))
	case ty.IsListType(), ty.IsSetType(), ty.IsTupleType():
		buf.WriteByte('[')
		for i, it := 0, v.ElementIterator(); it.Next(); i++ {
			if i > 0 {
				buf.WriteByte(',')
			}
			_, ev := it.Element()
			if err := writeValue(buf, ev); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case ty.IsMapType(), ty.IsObjectType():
		// Both iterate in key order, as ctyjson writes them.
		buf.WriteByte('{')
		for i, it := 0, v.ElementIterator(); it.Next(); i++ {
			if i > 0 {
				buf.WriteByte(',')
			}
			k, ev := it.Element()
			writeString(buf, k.AsString())
			buf.WriteByte(':')
			if err := writeValue(buf, ev); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	default:
		return fmt.Errorf("cannot encode a value of type %s", ty.FriendlyName())
	}
	return nil
}

func writeNumber(buf *bytes.Buffer, v cty.Value) error {
	f := v.AsBigFloat()
	if f.IsInf() {
		return fmt.Errorf("cannot encode infinity")
	}
	if f.IsInt() && !(f.Sign() == 0 && f.Signbit()) {
		if i, acc := f.Int64(); acc == big.Exact {
			buf.WriteString(strconv.FormatInt(i, 10))
			return nil
		}
	}
	buf.WriteString(f.Text('f', -1))
	return nil
}

// writeString writes s as encoding/json does (ctyjson uses it), taking a
// short cut for the plain ASCII most values are.
func writeString(buf *bytes.Buffer, s string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always encodes
			buf.Write(b)
			return
		}
	}
	buf.WriteByte('"')
	buf.WriteString(s)
	buf.WriteByte('"')
}

// Cache remembers the JSON of the blocks at the first level of one
// plugin's config block (a static plugin's services) by their source
// text, so that decoding the block again, on a reload, decodes only the
// blocks that changed. A block's JSON depends on its text alone; only
// blocks that decoded without a diagnostic are kept, so a problem is
// always found again, with its position. The zero value is empty.
type Cache struct {
	mu     sync.Mutex
	schema *sdk.Schema
	blocks map[string][]byte
}

// Decode is the package's Decode for a body parsed from src, the file's
// whole content: it takes unchanged blocks from c, and keeps what it
// decoded for the next call when there was no error.
func (c *Cache) Decode(body hcl.Body, src []byte, schema *sdk.Schema) ([]byte, hcl.Diagnostics) {
	spec, err := Spec(schema)
	if err != nil {
		return Decode(body, schema)
	}
	os, ok := spec.(hcldec.ObjectSpec)
	if !ok {
		return Decode(body, schema)
	}
	d, ok := compile(os)
	if !ok {
		return Decode(body, schema)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := &memo{src: src, next: map[string][]byte{}}
	if Equal(c.schema, schema) {
		m.prev = c.blocks
	}
	js, diags := decodeJSON(d, body, m)
	if !diags.HasErrors() {
		// What the file no longer holds is forgotten.
		c.schema, c.blocks = schema, m.next
	}
	return js, diags
}

// memo is one decode's use of a Cache.
type memo struct {
	src        []byte
	prev, next map[string][]byte
}

// key is the cache key of block b: its type and its source text, from
// its type name to its closing brace. A block not parsed from src by
// hclsyntax has none.
func (m *memo) key(typeName string, b *hcl.Block) (string, bool) {
	if m == nil {
		return "", false
	}
	body, ok := b.Body.(*hclsyntax.Body)
	if !ok {
		return "", false
	}
	from, to := b.DefRange.Start.Byte, body.SrcRange.End.Byte
	if b.DefRange.Filename != body.SrcRange.Filename || from < 0 || from > to || to > len(m.src) {
		return "", false
	}
	return typeName + "\x00" + string(m.src[from:to]), true
}

func (m *memo) get(key string, cacheable bool) ([]byte, bool) {
	if !cacheable {
		return nil, false
	}
	js, ok := m.prev[key]
	if ok {
		m.next[key] = js
	}
	return js, ok
}

func (m *memo) put(key string, js []byte) {
	m.next[key] = bytes.Clone(js)
}
