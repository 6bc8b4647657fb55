// Package configschema decodes a plugin's `config { }` block against the
// schema the plugin declared, reporting every problem with its position. The
// host uses it on plugins.hcl; sdk/sdktest uses it so plugin tests can write
// their config as HCL.
package configschema

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

// Spec turns a plugin schema into an hcldec spec. An error means the plugin
// declared a schema that cannot be decoded (a bad type expression, a label
// that collides with an attribute).
func Spec(s *sdk.Schema) (hcldec.Spec, error) {
	if s == nil {
		return hcldec.ObjectSpec{}, nil
	}
	return objectSpec(s, nil)
}

func objectSpec(s *sdk.Schema, labels []string) (hcldec.ObjectSpec, error) {
	spec := hcldec.ObjectSpec{}
	for i, l := range labels {
		spec[l] = &hcldec.BlockLabelSpec{Index: i, Name: l}
	}
	for _, a := range s.Attributes {
		if _, dup := spec[a.Name]; dup {
			return nil, fmt.Errorf("schema: %q is declared twice", a.Name)
		}
		if a.Type == sdk.TypeDuration {
			spec[a.Name] = durationSpec(a)
			continue
		}
		ty, err := ParseType(a.Type)
		if err != nil {
			return nil, fmt.Errorf("schema: attribute %q: %w", a.Name, err)
		}
		spec[a.Name] = &hcldec.AttrSpec{Name: a.Name, Type: ty, Required: a.Required}
	}
	for _, b := range s.Blocks {
		if _, dup := spec[b.TypeName]; dup {
			return nil, fmt.Errorf("schema: %q is declared twice", b.TypeName)
		}
		nested, err := objectSpec(&b.Body, b.Labels)
		if err != nil {
			return nil, fmt.Errorf("block %q: %w", b.TypeName, err)
		}
		if b.Single {
			spec[b.TypeName] = &hcldec.BlockListSpec{TypeName: b.TypeName, Nested: nested, MaxItems: 1}
		} else {
			spec[b.TypeName] = &hcldec.BlockListSpec{TypeName: b.TypeName, Nested: nested}
		}
	}
	return spec, nil
}

// durationSpec decodes a TypeDuration attribute: a string that
// time.ParseDuration accepts, checked here so the error points at the
// attribute in the operator's file rather than coming back from the plugin.
func durationSpec(a sdk.Attribute) hcldec.Spec {
	return &hcldec.ValidateSpec{
		Wrapped: &hcldec.AttrSpec{Name: a.Name, Type: cty.String, Required: a.Required},
		Func: func(v cty.Value) hcl.Diagnostics {
			if v.IsNull() || !v.IsKnown() {
				return nil
			}
			if _, err := sdk.ParseDuration(v.AsString()); err != nil {
				// No Subject: hcldec fills in the attribute's range.
				return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Invalid duration",
					Detail: fmt.Sprintf("%s: %v.", a.Name, err)}}
			}
			return nil
		},
	}
}

// ParseType parses an HCL type expression such as "list(string)".
func ParseType(s string) (cty.Type, error) {
	if s == "" {
		return cty.String, nil
	}
	expr, diags := hclsyntax.ParseExpression([]byte(s), "type", hcl.InitialPos)
	if diags.HasErrors() {
		return cty.NilType, fmt.Errorf("type %q: %s", s, diags.Error())
	}
	ty, diags := typeexpr.TypeConstraint(expr)
	if diags.HasErrors() {
		return cty.NilType, fmt.Errorf("type %q: %s", s, diags.Error())
	}
	return ty, nil
}

// Decode decodes body against schema and returns the JSON the plugin's
// Configure receives. Diagnostics carry positions in the body's file.
func Decode(body hcl.Body, schema *sdk.Schema) ([]byte, hcl.Diagnostics) {
	spec, err := Spec(schema)
	if err != nil {
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Plugin declared an invalid config schema", Detail: err.Error()}}
	}
	if os, ok := spec.(hcldec.ObjectSpec); ok {
		if d, ok := compile(os); ok {
			return decodeJSON(d, body, nil)
		}
	}
	return decodeHCLDec(body, spec)
}

// decodeHCLDec is Decode through hcldec and cty's JSON: for schemas the
// block decoder does not take, and, in tests, the reference it is held to.
func decodeHCLDec(body hcl.Body, spec hcldec.Spec) ([]byte, hcl.Diagnostics) {
	val, diags := hcldec.Decode(body, spec, nil)
	sortByPosition(diags)
	if diags.HasErrors() {
		return nil, diags
	}
	js, err := ctyjson.Marshal(val, val.Type())
	if err != nil {
		return nil, append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Cannot encode config", Detail: err.Error()})
	}
	return js, diags
}

// sortByPosition orders diagnostics as they appear in the file. hcldec
// decodes an object's members in map order, so without this the same file
// would list its problems in a different order on every run.
func sortByPosition(diags hcl.Diagnostics) {
	slices.SortStableFunc(diags, func(a, b *hcl.Diagnostic) int {
		if a.Subject == nil || b.Subject == nil {
			// Unpositioned diagnostics go last.
			return cmp.Compare(boolInt(a.Subject == nil), boolInt(b.Subject == nil))
		}
		return cmp.Or(cmp.Compare(a.Subject.Filename, b.Subject.Filename),
			cmp.Compare(a.Subject.Start.Byte, b.Subject.Start.Byte))
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ParseHCL parses src as a config block body and decodes it, for tests.
func ParseHCL(filename string, src []byte, schema *sdk.Schema) ([]byte, hcl.Diagnostics) {
	f, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, diags
	}
	return Decode(f.Body, schema)
}

// PathRange finds where path (as in sdk.Diagnostic.Path: block type names,
// block indexes and attribute names) points inside body. It returns the
// deepest range it can resolve, so a path into a missing attribute still
// points at the enclosing block.
func PathRange(body hcl.Body, path []string) hcl.Range {
	sb, ok := body.(*hclsyntax.Body)
	if !ok {
		return body.MissingItemRange()
	}
	rng := sb.SrcRange
	for i := 0; i < len(path); i++ {
		name := path[i]
		if a, ok := sb.Attributes[name]; ok {
			return a.SrcRange
		}
		idx := 0
		if i+1 < len(path) {
			if n, err := strconv.Atoi(path[i+1]); err == nil {
				idx = n
				i++
			}
		}
		var found *hclsyntax.Block
		n := 0
		for _, b := range sb.Blocks {
			if b.Type == name {
				if n == idx {
					found = b
					break
				}
				n++
			}
		}
		if found == nil {
			return rng
		}
		sb, rng = found.Body, found.DefRange()
	}
	return rng
}

// FromProto converts a schema received over the wire (Describe).
func FromProto(p *registryv1.Schema) *sdk.Schema {
	s := &sdk.Schema{}
	for _, a := range p.GetAttributes() {
		s.Attributes = append(s.Attributes, sdk.Attribute{Name: a.GetName(), Type: a.GetType(), Required: a.GetRequired(), Description: a.GetDescription(), Sensitive: a.GetSensitive()})
	}
	for _, b := range p.GetBlocks() {
		s.Blocks = append(s.Blocks, sdk.Block{
			TypeName: b.GetTypeName(), Labels: b.GetLabels(), Single: b.GetNesting() == registryv1.Nesting_NESTING_SINGLE,
			Body: *FromProto(b.GetBody()), Description: b.GetDescription(),
		})
	}
	return s
}

// Equal reports whether two schemas decode every body alike: the same
// attributes and blocks, in the same order, with the same types, labels
// and flags. Descriptions are compared too, so a plugin that changed in
// any way is not taken for the same. A nil list equals an empty one: a
// schema received over the wire (FromProto) has nil where the plugin's own
// value may have an empty list.
func Equal(a, b *sdk.Schema) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(a.Attributes, b.Attributes) &&
		slices.EqualFunc(a.Blocks, b.Blocks, func(x, y sdk.Block) bool {
			return x.TypeName == y.TypeName && x.Single == y.Single && x.Description == y.Description &&
				slices.Equal(x.Labels, y.Labels) && Equal(&x.Body, &y.Body)
		})
}
