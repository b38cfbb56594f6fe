"""A chat loop with the model's own chat template, streamed."""
import edgeinfer

eng = edgeinfer.load("default", n_ctx=2048)
messages = [{"role": "system", "content": "You are a concise assistant."}]
while True:
    try:
        user = input("you> ")
    except EOFError:
        break
    messages.append({"role": "user", "content": user})
    reply = ""
    print("bot> ", end="")
    for piece in eng.stream_chat(messages, max_tokens=256, temperature=0.3):
        print(piece, end="", flush=True)
        reply += piece
    print()
    messages.append({"role": "assistant", "content": reply})
