package chat

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkRender renders a 20-turn tool-using conversation with the
// Qwen3-style template.
func BenchmarkRender(b *testing.B) {
	src, err := os.ReadFile(filepath.Join("testdata", "templates", "qwen3.jinja"))
	if err != nil {
		b.Fatal(err)
	}
	tmpl, err := Compile(string(src))
	if err != nil {
		b.Fatal(err)
	}
	msgs := []Message{{Role: "system", Content: "You are a helpful assistant."}}
	for i := 0; i < 10; i++ {
		msgs = append(msgs, Message{Role: "user", Content: "What is the weather in Paris today, and should I bring an umbrella?"},
			Message{Role: "assistant", ContentNone: true, ToolCalls: []ToolCall{{Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris", "days": 1}`)}}},
			Message{Role: "tool", Content: `{"temp": 21, "rain": 0.2}`},
			Message{Role: "assistant", Content: "It is 21 degrees with a small chance of rain.", Reasoning: "Summarize the tool output."})
	}
	opts := Options{AddGenerationPrompt: true, Now: time.Unix(0, 0),
		Tools: []json.RawMessage{json.RawMessage(`{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}`)}}
	for b.Loop() {
		if _, err := tmpl.Render(msgs, opts); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCompile(b *testing.B) {
	src, err := os.ReadFile(filepath.Join("testdata", "templates", "gptoss.jinja"))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Compile(string(src)); err != nil {
			b.Fatal(err)
		}
	}
}
