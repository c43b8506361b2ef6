package docgen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// CRDFiles are the CRDs the API reference describes, relative to the repository's root.
//
// The reference is generated here rather than by crd-ref-docs (the maintained generator, which
// reads the Go types): crd-ref-docs leaves out the CEL rules' messages (x-kubernetes-validations),
// which are what a user whose object is refused reads. controller-gen's CRDs carry everything the
// markers say, defaults, bounds, enums and CEL rules included, and are what the API server enforces.
var CRDFiles = []string{
	"config/crd/bases/redline.dev_ratelimitpolicies.yaml",
	"config/crd/bases/redline.dev_redisbackends.yaml",
}

// ReadCRD reads one CRD manifest.
func ReadCRD(path string) (*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	return crd, nil
}

func genAPI(root string, b *bytes.Buffer) error {
	b.WriteString("\n# API reference\n\n")
	b.WriteString("Every field of Redline's custom resources, as the API server validates it: its type, default,\n")
	b.WriteString("bounds and allowed values, and the rules (CEL) each object must satisfy, with the message a\n")
	b.WriteString("refused object gets. Fields marked required must be set.\n")
	for _, f := range CRDFiles {
		crd, err := ReadCRD(filepath.Join(root, f))
		if err != nil {
			return err
		}
		for _, v := range crd.Spec.Versions {
			if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
				continue
			}
			fmt.Fprintf(b, "\n## %s (%s/%s)\n\n", crd.Spec.Names.Kind, crd.Spec.Group, v.Name)
			short := ""
			if len(crd.Spec.Names.ShortNames) > 0 {
				short = ", short name " + code(strings.Join(crd.Spec.Names.ShortNames, ", "))
			}
			fmt.Fprintf(b, "%s%s. `kubectl get %s` shows these columns (`-o wide` the priority 1 ones too):\n\n", crd.Spec.Scope, short, crd.Spec.Names.Plural)
			for _, c := range v.AdditionalPrinterColumns {
				fmt.Fprintf(b, "- %s: %s", c.Name, listCode(c.JSONPath))
				if c.Priority > 0 {
					fmt.Fprintf(b, " (priority %d)", c.Priority)
				}
				b.WriteString("\n")
			}
			s := *v.Schema.OpenAPIV3Schema
			// apiVersion, kind and metadata are every object's; the reference is about the rest.
			for _, k := range []string{"apiVersion", "kind", "metadata"} {
				delete(s.Properties, k)
			}
			writeObject(b, crd.Spec.Names.Kind, crd.Spec.Names.Kind, s)
		}
	}
	return nil
}

// writeObject writes the table of an object's fields, its rules, then each object inside it.
func writeObject(b *bytes.Buffer, kind, path string, s apiextensionsv1.JSONSchemaProps) {
	fmt.Fprintf(b, "\n### %s\n\n", code(path))
	if d := strings.TrimSpace(s.Description); d != "" && path != kind {
		b.WriteString(paragraph(d) + "\n\n")
	}
	required := map[string]bool{}
	for _, r := range s.Required {
		required[r] = true
	}
	names := sortedKeys(s.Properties)
	if len(names) > 0 {
		table(b, "Field", "Type", "Required", "Default", "Validation", "Description")
		for _, n := range names {
			p := s.Properties[n]
			req := ""
			if required[n] {
				req = "yes"
			}
			row(b, code(n), cell(typeOf(p)), req, code(jsonText(p.Default)), cell(strings.Join(bounds(p), "; ")), cell(p.Description))
		}
	}
	if rules := validations(s); len(rules) > 0 {
		b.WriteString("\nRules of this object (a violation is refused with the message):\n\n")
		for _, r := range rules {
			b.WriteString("- " + r + "\n")
		}
	}
	for _, n := range names {
		p := s.Properties[n]
		child := path + "." + n
		for p.Type == "array" && p.Items != nil && p.Items.Schema != nil {
			if rules := validations(p); len(rules) > 0 {
				fmt.Fprintf(b, "\nRules of %s:\n\n", code(child))
				for _, r := range rules {
					b.WriteString("- " + r + "\n")
				}
			}
			p, child = *p.Items.Schema, child+"[]"
		}
		if p.Type == "object" && p.AdditionalProperties != nil && p.AdditionalProperties.Schema != nil && len(p.Properties) == 0 {
			p, child = *p.AdditionalProperties.Schema, child+"{}"
		}
		if p.Type == "object" && (len(p.Properties) > 0 || len(validations(p)) > 0) {
			writeObject(b, kind, child, p)
		} else if rules := validations(p); len(rules) > 0 {
			fmt.Fprintf(b, "\nRules of %s:\n\n", code(child))
			for _, r := range rules {
				b.WriteString("- " + r + "\n")
			}
		}
	}
}

// typeOf is a field's type as a user writes it.
func typeOf(p apiextensionsv1.JSONSchemaProps) string {
	t := p.Type
	if p.XIntOrString {
		t = "integer or string"
	}
	switch {
	case t == "array" && p.Items != nil && p.Items.Schema != nil:
		t = "[]" + typeOf(*p.Items.Schema)
	case t == "object" && p.AdditionalProperties != nil && p.AdditionalProperties.Schema != nil:
		t = "map[string]" + typeOf(*p.AdditionalProperties.Schema)
	}
	if p.Format != "" {
		t += " (" + p.Format + ")"
	}
	return t
}

// bounds lists what the schema allows beyond the type: enum, bounds, pattern, list kind.
func bounds(p apiextensionsv1.JSONSchemaProps) []string {
	var out []string
	if len(p.Enum) > 0 {
		var vs []string
		for _, e := range p.Enum {
			vs = append(vs, code(jsonText(&e)))
		}
		out = append(out, "one of "+strings.Join(vs, ", "))
	}
	num := func(what string, v *float64, exclusive bool) {
		if v != nil {
			s := fmt.Sprintf("%s %g", what, *v)
			if exclusive {
				s += " (exclusive)"
			}
			out = append(out, s)
		}
	}
	num("minimum", p.Minimum, p.ExclusiveMinimum)
	num("maximum", p.Maximum, p.ExclusiveMaximum)
	count := func(what string, v *int64) {
		if v != nil {
			out = append(out, fmt.Sprintf("%s %d", what, *v))
		}
	}
	count("min length", p.MinLength)
	count("max length", p.MaxLength)
	count("min items", p.MinItems)
	count("max items", p.MaxItems)
	count("min properties", p.MinProperties)
	count("max properties", p.MaxProperties)
	if p.Pattern != "" {
		out = append(out, "pattern "+code(p.Pattern))
	}
	if p.XListType != nil && *p.XListType != "atomic" {
		s := "list type " + *p.XListType
		if len(p.XListMapKeys) > 0 {
			s += " keyed by " + strings.Join(p.XListMapKeys, ", ")
		}
		out = append(out, s)
	}
	return out
}

// validations are an object's CEL rules: each one's message, or the rule where it has none.
func validations(p apiextensionsv1.JSONSchemaProps) []string {
	var out []string
	for _, v := range p.XValidations {
		msg := v.Message
		if msg == "" {
			msg = v.Rule
		}
		s := oneLine(msg)
		if v.FieldPath != "" {
			s += " (on `" + v.FieldPath + "`)"
		}
		out = append(out, s+" — rule "+listCode(oneLine(v.Rule)))
	}
	sort.Strings(out)
	return out
}

func jsonText(j *apiextensionsv1.JSON) string {
	if j == nil {
		return ""
	}
	var v any
	if err := json.Unmarshal(j.Raw, &v); err != nil {
		return string(j.Raw)
	}
	if s, ok := v.(string); ok {
		return s
	}
	return string(j.Raw)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// listCode is s as inline code outside a table, fenced past any backtick it holds.
func listCode(s string) string {
	if strings.Contains(s, "`") {
		return "`` " + s + " ``"
	}
	return "`" + s + "`"
}

// paragraph joins a description's lines into Markdown paragraphs.
func paragraph(s string) string {
	var paras []string
	for p := range strings.SplitSeq(s, "\n\n") {
		paras = append(paras, strings.Join(strings.Fields(p), " "))
	}
	return strings.Join(paras, "\n\n")
}
