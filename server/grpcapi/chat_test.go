package grpcapi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mkserve/mkserve/chat"
	pb "github.com/mkserve/mkserve/proto/mkserve/v1"
)

func loadTemplate(t *testing.T, name string) *chat.Template {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "..", "chat", "testdata", "templates", name))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.Compile(string(src))
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

// TestGenerateChat: a Chat prompt reaches the engine as the chat
// template's rendering, tokenized without added special tokens; template
// kwargs and add_generation_prompt apply; bad messages, bad kwargs and a
// server without a template are InvalidArgument naming the field.
func TestGenerateChat(t *testing.T) {
	tmpl := loadTemplate(t, "qwen3.jinja")
	h := start(t, newFake(4096, loadTok(t).VocabSize()), Options{Template: tmpl})
	msgs := []*pb.ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Who made the light?"}}
	maxTok := int32(4)
	resp, err := h.client.Generate(ctxT(t), &pb.GenerateRequest{
		Prompt:   &pb.GenerateRequest_Chat{Chat: &pb.Chat{Messages: msgs, ChatTemplateKwargsJson: `{"enable_thinking": false}`}},
		Sampling: &pb.SamplingParams{MaxTokens: &maxTok},
	})
	if err != nil || len(resp.Choices) != 1 {
		t.Fatalf("%v %v", resp, err)
	}
	want, err := tmpl.Render([]chat.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Who made the light?"}},
		chat.Options{AddGenerationPrompt: true, Kwargs: map[string]any{"enable_thinking": false}})
	if err != nil {
		t.Fatal(err)
	}
	reqs := h.fake.requests()
	got, _ := loadTok(t).Decode(reqs[len(reqs)-1].Prompt, false)
	if got != want || !strings.Contains(got, "<think>\n\n</think>") {
		t.Errorf("the engine got %q, want the template's %q", got, want)
	}
	no := false
	if _, err := h.client.Generate(ctxT(t), &pb.GenerateRequest{
		Prompt: &pb.GenerateRequest_Chat{Chat: &pb.Chat{Messages: msgs, AddGenerationPrompt: &no}}, Sampling: &pb.SamplingParams{MaxTokens: &maxTok},
	}); err != nil {
		t.Fatal(err)
	}
	reqs = h.fake.requests()
	if got, _ := loadTok(t).Decode(reqs[len(reqs)-1].Prompt, false); strings.HasSuffix(strings.TrimSpace(got), "<|im_start|>assistant") {
		t.Errorf("add_generation_prompt false still opened the assistant turn: %q", got)
	}
	for _, c := range []struct {
		chat  *pb.Chat
		field string
	}{
		{&pb.Chat{}, "chat.messages"},
		{&pb.Chat{Messages: []*pb.ChatMessage{{Role: "robot", Content: "x"}}}, "chat.messages[0].role"},
		{&pb.Chat{Messages: msgs, ChatTemplateKwargsJson: `[1]`}, "chat.chat_template_kwargs_json"},
		{&pb.Chat{Messages: msgs, ChatTemplateKwargsJson: `{"messages": 1}`}, "chat.chat_template_kwargs_json"},
	} {
		_, err := h.client.Generate(ctxT(t), &pb.GenerateRequest{Prompt: &pb.GenerateRequest_Chat{Chat: c.chat}})
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), c.field) {
			t.Errorf("%v: %v, want InvalidArgument naming %s", c.chat, err, c.field)
		}
	}
	bare := start(t, newFake(4096, loadTok(t).VocabSize()), Options{})
	_, err = bare.client.Generate(ctxT(t), &pb.GenerateRequest{Prompt: &pb.GenerateRequest_Chat{Chat: &pb.Chat{Messages: msgs}}})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "no chat template") {
		t.Errorf("no template: %v", err)
	}
}
