package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"gopkg.in/yaml.v3"
)

// Load reads a YAML configuration file over the defaults. Unknown keys,
// repeated keys and values of the wrong type are errors naming the file,
// the line and the key. Load does not validate: call Validate once the
// environment and flags are applied too (Parse does all of it).
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return LoadBytes(path, data)
}

// LoadBytes is Load on the bytes of a file; name labels errors.
func LoadBytes(name string, data []byte) (*Config, error) {
	c := Default()
	if err := c.decodeYAML(data); err != nil {
		return nil, fmt.Errorf("config: %s: %w", name, err)
	}
	return c, nil
}

// decodeYAML overlays the settings of one YAML document on c.
func (c *Config) decodeYAML(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file: the defaults
		}
		return err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return err
		}
		return fmt.Errorf("line %d: more than one YAML document", extra.Line)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil
		}
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		return nil // a file of comments only
	}
	byKey := map[string]value{}
	for _, f := range c.fields() {
		byKey[f.key] = f.v
	}
	return decodeMapping(root, "", byKey)
}

// decodeMapping sets the fields of one mapping; prefix is "" at the top and
// "engine." inside the engine block.
func decodeMapping(m *yaml.Node, prefix string, byKey map[string]value) error {
	where := "the top level"
	if prefix != "" {
		where = prefix[:len(prefix)-1]
	}
	if m.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: %s must be a mapping of keys to values, got %s", m.Line, where, describe(m))
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return fmt.Errorf("line %d: a key in %s is %s, not a name", k.Line, where, describe(k))
		}
		key := prefix + k.Value
		if line, dup := seen[k.Value]; dup {
			return fmt.Errorf("line %d: key %q repeats (first on line %d)", k.Line, key, line)
		}
		seen[k.Value] = k.Line
		if prefix == "" && k.Value == "engine" {
			if v.ShortTag() == "!!null" {
				continue
			}
			if err := decodeMapping(v, "engine.", byKey); err != nil {
				return err
			}
			continue
		}
		f, ok := byKey[key]
		if !ok {
			return fmt.Errorf("line %d: unknown key %q", k.Line, key)
		}
		if err := f.decode(v); err != nil {
			return fmt.Errorf("line %d: %s: %w", v.Line, key, err)
		}
	}
	return nil
}
