package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Config holds the settings of a tokenizer_config.json that serving needs.
type Config struct {
	BOSToken string // "" when absent or null
	EOSToken string
	PadToken string
	UnkToken string
	AddBOS   bool // add_bos_token
	AddEOS   bool // add_eos_token

	// ChatTemplate is the default chat template: the string form, or the
	// entry named "default" of the list form.
	ChatTemplate string
	// ChatTemplates holds every named template ("default" included).
	ChatTemplates map[string]string

	ModelMaxLength int64 // 0 when absent or not an integer
}

type configJSON struct {
	BOSToken       json.RawMessage `json:"bos_token"`
	EOSToken       json.RawMessage `json:"eos_token"`
	PadToken       json.RawMessage `json:"pad_token"`
	UnkToken       json.RawMessage `json:"unk_token"`
	AddBOS         *bool           `json:"add_bos_token"`
	AddEOS         *bool           `json:"add_eos_token"`
	ChatTemplate   json.RawMessage `json:"chat_template"`
	ModelMaxLength json.RawMessage `json:"model_max_length"`
}

// specialTokenString reads a special token given as a string, null, or an
// object with a "content" field.
func specialTokenString(where, field string, raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", fmt.Errorf("tokenizer: %s: %s: want a string or {\"content\": ...}, got %s", where, field, raw)
	}
	return *obj.Content, nil
}

func parseConfig(where string, data []byte) (*Config, error) {
	var c configJSON
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: malformed JSON: %w", where, err)
	}
	cfg := &Config{ChatTemplates: map[string]string{}}
	var err error
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *string
	}{
		{"bos_token", c.BOSToken, &cfg.BOSToken},
		{"eos_token", c.EOSToken, &cfg.EOSToken},
		{"pad_token", c.PadToken, &cfg.PadToken},
		{"unk_token", c.UnkToken, &cfg.UnkToken},
	} {
		if *f.dst, err = specialTokenString(where, f.name, f.raw); err != nil {
			return nil, err
		}
	}
	if c.AddBOS != nil {
		cfg.AddBOS = *c.AddBOS
	}
	if c.AddEOS != nil {
		cfg.AddEOS = *c.AddEOS
	}
	if !isNull(c.ModelMaxLength) {
		var n json.Number
		d := json.NewDecoder(bytes.NewReader(c.ModelMaxLength))
		d.UseNumber()
		if d.Decode(&n) == nil {
			if v, err := n.Int64(); err == nil {
				cfg.ModelMaxLength = v
			}
		}
	}
	if !isNull(c.ChatTemplate) {
		var s string
		if err := json.Unmarshal(c.ChatTemplate, &s); err == nil {
			cfg.ChatTemplate = s
			cfg.ChatTemplates["default"] = s
		} else {
			var list []struct {
				Name     *string `json:"name"`
				Template *string `json:"template"`
			}
			if err := json.Unmarshal(c.ChatTemplate, &list); err != nil {
				return nil, fmt.Errorf("tokenizer: %s: chat_template: want a string or a list of {name, template}: %w", where, err)
			}
			for i, e := range list {
				if e.Name == nil || e.Template == nil {
					return nil, fmt.Errorf("tokenizer: %s: chat_template[%d]: want {name, template}", where, i)
				}
				cfg.ChatTemplates[*e.Name] = *e.Template
			}
			cfg.ChatTemplate = cfg.ChatTemplates["default"]
		}
	}
	return cfg, nil
}

// ChatTemplateFor picks the template transformers would: the one named
// "tool_use" when tools are given and it exists, else the default.
func (c *Config) ChatTemplateFor(withTools bool) string {
	if withTools {
		if t, ok := c.ChatTemplates["tool_use"]; ok {
			return t
		}
	}
	return c.ChatTemplate
}

// readTemplateFiles loads dir/chat_template.jinja, or else the
// "chat_template" field of dir/chat_template.json.
func (c *Config) readTemplateFiles(dir string) error {
	p := filepath.Join(dir, "chat_template.jinja")
	data, err := os.ReadFile(p)
	switch {
	case err == nil:
		c.ChatTemplate = string(data)
		c.ChatTemplates["default"] = c.ChatTemplate
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("tokenizer: %w", err)
	}
	p = filepath.Join(dir, "chat_template.json")
	data, err = os.ReadFile(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("tokenizer: %w", err)
	}
	var v struct {
		ChatTemplate *string `json:"chat_template"`
	}
	if err := json.Unmarshal(data, &v); err != nil || v.ChatTemplate == nil {
		return fmt.Errorf("tokenizer: %s: chat_template: want {\"chat_template\": string}", p)
	}
	c.ChatTemplate = *v.ChatTemplate
	c.ChatTemplates["default"] = c.ChatTemplate
	return nil
}
