// OpenAI's request and response objects (openai_api.h): parsing with every field checked, and
// building the responses, chunks and errors.
#include "serve/openai_api.h"

#include <algorithm>

#include "util/json.h"

namespace barellm::serve {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

std::string error_type(int status) {
    switch (status) {
        case 401:
            return "authentication_error";
        case 404:
            return "not_found_error";
        case 503:
            return "server_error";
        default:
            return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

// The value of `name` in `object`, or nullptr when it is absent or null.
const json* field(const json& object, const char* name) {
    const auto found = object.find(name);
    return found == object.end() || found->is_null() ? nullptr : &*found;
}

ApiError wrong_field(const std::string& name, const std::string& needs, const json& value) {
    return ApiError(400, "'" + name + "' must be " + needs + ", got " + json_excerpt(value), name,
                    "invalid_value");
}

std::optional<float> number_field(const json& object, const char* name, float lowest, float highest,
                                  bool above_lowest = false) {
    const json* value = field(object, name);
    if (!value) return std::nullopt;
    const std::string range =
        (above_lowest ? "(" : "[") + json(lowest).dump() + ", " + json(highest).dump() + "]";
    if (!value->is_number()) throw wrong_field(name, "a number in " + range, *value);
    const double number = value->get<double>();
    if (!(number >= lowest && number <= highest) || (above_lowest && number == lowest))
        throw wrong_field(name, "a number in " + range, *value);
    return float(number);
}

std::optional<int64_t> integer_field(const json& object, const char* name, int64_t lowest,
                                     int64_t highest) {
    const json* value = field(object, name);
    if (!value) return std::nullopt;
    const std::string needs =
        "an integer in [" + std::to_string(lowest) + ", " + std::to_string(highest) + "]";
    if (!value->is_number_integer()) throw wrong_field(name, needs, *value);
    if (value->is_number_unsigned() && value->get<uint64_t>() > uint64_t(INT64_MAX))
        throw wrong_field(name, needs, *value);
    const int64_t number = value->get<int64_t>();
    if (number < lowest || number > highest) throw wrong_field(name, needs, *value);
    return number;
}

bool bool_field(const json& object, const char* name) {
    const json* value = field(object, name);
    if (!value) return false;
    if (!value->is_boolean()) throw wrong_field(name, "true or false", *value);
    return value->get<bool>();
}

std::vector<std::string> stop_field(const json& object) {
    const json* value = field(object, "stop");
    if (!value) return {};
    const std::string needs =
        "a string or a list of at most " + std::to_string(kMaxStopStrings) + " non-empty strings";
    std::vector<std::string> stops;
    if (value->is_string()) {
        stops.push_back(value->get<std::string>());
    } else if (value->is_array() && value->size() <= size_t(kMaxStopStrings)) {
        for (const json& item : *value) {
            if (!item.is_string()) throw wrong_field("stop", needs, *value);
            stops.push_back(item.get<std::string>());
        }
    } else {
        throw wrong_field("stop", needs, *value);
    }
    for (const std::string& stop : stops)
        if (stop.empty()) throw wrong_field("stop", needs, *value);
    return stops;
}

json parse_object(std::string_view body) {
    json object;
    try {
        object = parse_json(body, "the request body");
    } catch (const Error& e) {
        throw ApiError(400, e.what());
    }
    if (!object.is_object())
        throw ApiError(400, "the request body must be a JSON object, got " + json_excerpt(object));
    return object;
}

constexpr int64_t kMaxTokensLimit = 1 << 24;  // as many as the largest --ctx
constexpr float kMaxTemperature = 100.0f;     // as `run` --temp
constexpr float kMaxRepeatPenalty = 100.0f;

GenerationFields parse_fields(const json& object) {
    GenerationFields fields;
    if (const json* model = field(object, "model")) {
        if (!model->is_string()) throw wrong_field("model", "a string", *model);
        fields.model = model->get<std::string>();
    }
    const auto n = integer_field(object, "n", INT64_MIN, INT64_MAX);
    if (n && *n != 1) throw ApiError(400, "'n' must be 1: one choice per request", "n");
    for (const char* name : {"max_tokens", "max_completion_tokens"})
        if (const auto max_tokens = integer_field(object, name, 1, kMaxTokensLimit))
            fields.max_tokens = int(*max_tokens);
    fields.temperature = number_field(object, "temperature", 0, kMaxTemperature);
    fields.top_p = number_field(object, "top_p", 0, 1);
    fields.min_p = number_field(object, "min_p", 0, 1);
    fields.repeat_penalty =
        number_field(object, "repeat_penalty", 0, kMaxRepeatPenalty, /*above_lowest=*/true);
    if (const auto top_k = integer_field(object, "top_k", 0, INT32_MAX)) fields.top_k = int(*top_k);
    if (const auto seed = integer_field(object, "seed", INT64_MIN, INT64_MAX))
        fields.seed = uint64_t(*seed);
    fields.stop = stop_field(object);
    fields.stream = bool_field(object, "stream");
    if (const json* options = field(object, "stream_options")) {
        if (!options->is_object()) throw wrong_field("stream_options", "an object", *options);
        fields.include_usage = bool_field(*options, "include_usage");
    }
    return fields;
}

bool is_id_list(const json& value) {
    if (!value.is_array() || value.empty()) return false;
    for (const json& item : value)
        if (!item.is_number_integer()) return false;
    return true;
}

std::vector<int> id_list(const json& value) {
    std::vector<int> ids;
    for (const json& item : value) {
        // Ids beyond int are out of every vocabulary: -1 is refused as one later.
        const bool fits = item.is_number_unsigned() ? item.get<uint64_t>() <= uint64_t(INT32_MAX)
                                                    : item.get<int64_t>() >= INT32_MIN &&
                                                          item.get<int64_t>() <= INT32_MAX;
        ids.push_back(fits ? item.get<int>() : -1);
    }
    return ids;
}

// A message's content: a string, or a list of text parts [{"type": "text", "text": ...}].
std::string message_content(const json& content, size_t index) {
    const std::string name = "messages[" + std::to_string(index) + "].content";
    const std::string needs = "a string or a list of text parts";
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) throw wrong_field(name, needs, content);
    std::string text;
    for (const json& part : content) {
        const json* type = part.is_object() ? field(part, "type") : nullptr;
        const json* part_text = part.is_object() ? field(part, "text") : nullptr;
        if (!type || *type != "text" || !part_text || !part_text->is_string())
            throw wrong_field(name, needs, part);
        text += part_text->get<std::string>();
    }
    return text;
}

// A call of an assistant message: {"id", "type": "function", "function": {"name",
// "arguments"}}, the arguments as a JSON string (OpenAI's) or an object.
ToolCall message_tool_call(const json& call, const std::string& name) {
    const std::string needs =
        "a call {\"type\": \"function\", \"function\": {\"name\": ..., \"arguments\": ...}}";
    if (!call.is_object()) throw wrong_field(name, needs, call);
    const json* type = field(call, "type");
    const json* function = field(call, "function");
    if ((type && *type != "function") || !function || !function->is_object())
        throw wrong_field(name, needs, call);
    const json* function_name = field(*function, "name");
    const json* arguments = field(*function, "arguments");
    if (!function_name || !function_name->is_string() ||
        function_name->get_ref<const std::string&>().empty())
        throw wrong_field(name + ".function.name", "a non-empty string",
                          function_name ? *function_name : json(nullptr));
    ToolCall tool_call;
    tool_call.name = function_name->get<std::string>();
    if (arguments && arguments->is_string())
        tool_call.arguments = arguments->get<std::string>();
    else if (arguments && arguments->is_object())
        tool_call.arguments = arguments->dump();
    else if (arguments)
        throw wrong_field(name + ".function.arguments", "a string of JSON or an object",
                          *arguments);
    else
        tool_call.arguments = "{}";
    if (const json* id = field(call, "id")) {
        if (!id->is_string()) throw wrong_field(name + ".id", "a string", *id);
        tool_call.id = id->get<std::string>();
    }
    return tool_call;
}

// messages[index]: a role, a content (optional for an assistant message with calls) and an
// assistant message's tool_calls.
ChatMessage chat_message(const json& message, size_t index) {
    const std::string name = "messages[" + std::to_string(index) + "]";
    if (!message.is_object())
        throw wrong_field(name, "an object with a role and a content", message);
    const json* role = field(message, "role");
    const char* roles = "\"system\", \"user\", \"assistant\" or \"tool\"";
    if (!role || !role->is_string())
        throw wrong_field(name + ".role", roles, role ? *role : json(nullptr));
    ChatMessage parsed;
    parsed.role = *role == "developer" ? "system" : role->get<std::string>();
    if (parsed.role != "system" && parsed.role != "user" && parsed.role != "assistant" &&
        parsed.role != "tool")
        throw wrong_field(name + ".role", roles, *role);
    if (const json* calls = field(message, "tool_calls")) {
        if (parsed.role != "assistant" || !calls->is_array())
            throw wrong_field(name + ".tool_calls", "a list of calls, in an assistant message",
                              *calls);
        for (size_t i = 0; i < calls->size(); ++i)
            parsed.tool_calls.push_back(
                message_tool_call((*calls)[i], name + ".tool_calls[" + std::to_string(i) + "]"));
    }
    const json* content = field(message, "content");
    if (content)
        parsed.content = message_content(*content, index);
    else if (parsed.tool_calls.empty())
        throw ApiError(400, "'" + name + ".content' is missing", name + ".content",
                       "missing_required_field");
    return parsed;
}

// tools[index]: {"type": "function", "function": {"name", "description", "parameters"}}.
void check_tool(const json& tool, size_t index) {
    const std::string name = "tools[" + std::to_string(index) + "]";
    const std::string needs =
        "a function {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}";
    const json* type = tool.is_object() ? field(tool, "type") : nullptr;
    const json* function = tool.is_object() ? field(tool, "function") : nullptr;
    if (!type || *type != "function" || !function || !function->is_object())
        throw wrong_field(name, needs, tool);
    const json* function_name = field(*function, "name");
    if (!function_name || !function_name->is_string() ||
        function_name->get_ref<const std::string&>().empty())
        throw wrong_field(name + ".function.name", "a non-empty string",
                          function_name ? *function_name : json(nullptr));
    const json* description = field(*function, "description");
    if (description && !description->is_string())
        throw wrong_field(name + ".function.description", "a string", *description);
    const json* parameters = field(*function, "parameters");
    if (parameters && !parameters->is_object())
        throw wrong_field(name + ".function.parameters", "a JSON Schema object", *parameters);
}

// tool_choice: "auto", "none", "required" or {"type": "function", "function": {"name"}}
// naming one of the request's tools.
void parse_tool_choice(const json& choice, ChatRequest& request) {
    const std::string needs =
        "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
        "{\"name\": ...}}";
    if (choice == "auto" || choice == "none" || choice == "required") {
        request.tool_choice = choice == "auto"   ? ToolChoice::Auto
                              : choice == "none" ? ToolChoice::None
                                                 : ToolChoice::Required;
    } else {
        const json* type = choice.is_object() ? field(choice, "type") : nullptr;
        const json* function = choice.is_object() ? field(choice, "function") : nullptr;
        const json* name = function && function->is_object() ? field(*function, "name") : nullptr;
        if (!type || *type != "function" || !name || !name->is_string())
            throw wrong_field("tool_choice", needs, choice);
        request.tool_choice = ToolChoice::Function;
        request.forced_function = name->get<std::string>();
        const bool known =
            std::any_of(request.tools.begin(), request.tools.end(), [&](const ordered_json& tool) {
                return tool["function"]["name"] == request.forced_function;
            });
        if (!known)
            throw ApiError(400,
                           "'tool_choice' names the function " +
                               quoted_excerpt(request.forced_function) + ", which 'tools' has not",
                           "tool_choice");
    }
    if (request.tool_choice == ToolChoice::Required && request.tools.empty())
        throw ApiError(400, "'tool_choice' \"required\" needs 'tools'", "tool_choice");
}

json tool_call_object(const ToolCall& call) {
    return {{"id", call.id},
            {"type", "function"},
            {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

json finish_reason_value(const std::string& finish_reason) {
    return finish_reason.empty() ? json(nullptr) : json(finish_reason);
}

json header_object(const ResponseHeader& header, const char* object) {
    return {{"id", header.id},
            {"object", object},
            {"created", header.created},
            {"model", header.model}};
}

}  // namespace

ApiError::ApiError(int status_, const std::string& message, std::string param_, std::string code_)
    : Error(message),
      status(status_),
      type(error_type(status_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

CompletionRequest parse_completion_request(std::string_view body) {
    const json object = parse_object(body);
    CompletionRequest request;
    request.fields = parse_fields(object);
    const json* prompt = field(object, "prompt");
    const std::string needs =
        "a string, a list of one string, a list of token ids or a list of one list of token ids";
    if (!prompt) throw ApiError(400, "'prompt' is missing", "prompt", "missing_required_field");
    if (prompt->is_string()) {
        request.prompt_text = prompt->get<std::string>();
    } else if (is_id_list(*prompt)) {
        request.prompt_ids = id_list(*prompt);
        request.has_prompt_ids = true;
    } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
        request.prompt_text = (*prompt)[0].get<std::string>();
    } else if (prompt->is_array() && prompt->size() == 1 && is_id_list((*prompt)[0])) {
        request.prompt_ids = id_list((*prompt)[0]);
        request.has_prompt_ids = true;
    } else {
        throw wrong_field("prompt", needs, *prompt);
    }
    return request;
}

ChatRequest parse_chat_request(std::string_view body) {
    const json object = parse_object(body);
    ChatRequest request;
    request.fields = parse_fields(object);
    const json* messages = field(object, "messages");
    if (!messages)
        throw ApiError(400, "'messages' is missing", "messages", "missing_required_field");
    if (!messages->is_array() || messages->empty())
        throw wrong_field("messages", "a non-empty list of messages", *messages);
    for (size_t i = 0; i < messages->size(); ++i)
        request.messages.push_back(chat_message((*messages)[i], i));
    if (const json* effort = field(object, "reasoning_effort")) {
        if (!effort->is_string())
            throw wrong_field("reasoning_effort", "\"low\", \"medium\" or \"high\"", *effort);
        request.reasoning_effort = effort->get<std::string>();
    }
    if (const json* tools = field(object, "tools")) {
        if (!tools->is_array()) throw wrong_field("tools", "a list of functions", *tools);
        for (size_t i = 0; i < tools->size(); ++i) check_tool((*tools)[i], i);
        // The definitions again, their keys in the client's order: the template writes them.
        const ordered_json ordered = parse_ordered_json(body, "the request body");
        for (const ordered_json& tool : ordered.at("tools")) request.tools.push_back(tool);
    }
    if (const json* choice = field(object, "tool_choice")) parse_tool_choice(*choice, request);
    return request;
}

bool request_calls_tools(const ChatRequest& request) {
    return !request.tools.empty() && request.tool_choice != ToolChoice::None;
}

std::string forced_call_prefix(const ChatTemplate& chat, const ChatRequest& request) {
    if (!chat_renders_tools(chat)) return "";
    if (request.tool_choice == ToolChoice::Required) return forced_call_start(chat.tool_format, "");
    if (request.tool_choice == ToolChoice::Function)
        return forced_call_start(chat.tool_format, request.forced_function);
    return "";
}

std::string render_chat_request(const ChatTemplate& chat, const ChatRequest& request,
                                const std::string& bos_text, const std::string& eos_text) {
    const bool calls_or_results = std::any_of(
        request.messages.begin(), request.messages.end(), [](const ChatMessage& message) {
            return message.role == "tool" || !message.tool_calls.empty();
        });
    if (!chat_renders_tools(chat) && !request_calls_tools(request) && !calls_or_results)
        return render_conversation(chat, request.messages, bos_text, eos_text);
    try {
        return render_tool_conversation(
                   chat, request.messages,
                   request_calls_tools(request) ? request.tools : std::vector<ordered_json>{},
                   bos_text) +
               forced_call_prefix(chat, request);
    } catch (const Error& e) {
        throw ApiError(
            400, std::string("the model's chat template cannot render these messages: ") + e.what(),
            request_calls_tools(request) && !chat_renders_tools(chat) ? "tools" : "messages");
    }
}

std::string render_conversation(const ChatTemplate& chat, const std::vector<ChatMessage>& messages,
                                const std::string& bos_text, const std::string& eos_text) {
    size_t at = 0;
    std::optional<std::string> system;
    if (!messages.empty() && messages[0].role == "system") system = messages[at++].content;
    const char* order =
        "the messages must be an optional system message, then user and assistant messages "
        "in turn, ending with a user message";
    // messages[at..] must be user, assistant, user, ..., user.
    const size_t rest = messages.size() - at;
    if (rest % 2 == 0) throw ApiError(400, order, "messages");
    for (size_t i = at; i < messages.size(); ++i)
        if (messages[i].role != ((i - at) % 2 == 0 ? "user" : "assistant"))
            throw ApiError(
                400,
                std::string(order) + "; messages[" + std::to_string(i) + "] is " + messages[i].role,
                "messages");
    try {
        std::string text = render_chat(chat, system, messages[at].content, bos_text);
        for (size_t i = at + 1; i < messages.size(); i += 2)
            text += render_reply(chat, messages[i].content) +
                    render_next_turn(chat, messages[i + 1].content, bos_text, eos_text);
        return text;
    } catch (const ApiError&) {
        throw;
    } catch (const Error& e) {
        throw ApiError(
            400, std::string("the model's chat template cannot render these messages: ") + e.what(),
            "messages");
    }
}

json usage_object(const Usage& usage) {
    return {{"prompt_tokens", usage.prompt_tokens},
            {"completion_tokens", usage.completion_tokens},
            {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json completion_response(const ResponseHeader& header, const std::string& text,
                         const std::string& finish_reason, const Usage& usage) {
    json response = header_object(header, "text_completion");
    response["choices"] = json::array({{{"index", 0},
                                        {"text", text},
                                        {"logprobs", nullptr},
                                        {"finish_reason", finish_reason_value(finish_reason)}}});
    response["usage"] = usage_object(usage);
    return response;
}

json completion_chunk(const ResponseHeader& header, const std::string& text,
                      const std::string& finish_reason) {
    json chunk = header_object(header, "text_completion");
    chunk["choices"] = json::array({{{"index", 0},
                                     {"text", text},
                                     {"logprobs", nullptr},
                                     {"finish_reason", finish_reason_value(finish_reason)}}});
    return chunk;
}

json chat_response(const ResponseHeader& header, const std::string& text,
                   const std::vector<ToolCall>& calls, const std::string& finish_reason,
                   const Usage& usage) {
    json response = header_object(header, "chat.completion");
    json message = {{"role", "assistant"},
                    {"content", calls.empty() || !text.empty() ? json(text) : json(nullptr)}};
    if (!calls.empty()) {
        message["tool_calls"] = json::array();
        for (const ToolCall& call : calls) message["tool_calls"].push_back(tool_call_object(call));
    }
    response["choices"] = json::array({{{"index", 0},
                                        {"message", message},
                                        {"logprobs", nullptr},
                                        {"finish_reason", finish_reason_value(finish_reason)}}});
    response["usage"] = usage_object(usage);
    return response;
}

json chat_role_chunk(const ResponseHeader& header) {
    json chunk = header_object(header, "chat.completion.chunk");
    chunk["choices"] = json::array({{{"index", 0},
                                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}});
    return chunk;
}

json chat_chunk(const ResponseHeader& header, const std::string& text,
                const std::string& finish_reason) {
    json chunk = header_object(header, "chat.completion.chunk");
    const json delta = finish_reason.empty() ? json{{"content", text}} : json::object();
    chunk["choices"] = json::array({{{"index", 0},
                                     {"delta", delta},
                                     {"logprobs", nullptr},
                                     {"finish_reason", finish_reason_value(finish_reason)}}});
    return chunk;
}

json chat_tool_call_chunk(const ResponseHeader& header, const ToolCall& call, int index) {
    json chunk = header_object(header, "chat.completion.chunk");
    json delta_call = tool_call_object(call);
    delta_call["index"] = index;
    chunk["choices"] = json::array({{{"index", 0},
                                     {"delta", {{"tool_calls", json::array({delta_call})}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}});
    return chunk;
}

json usage_chunk(const ResponseHeader& header, bool chat, const Usage& usage) {
    json chunk = header_object(header, chat ? "chat.completion.chunk" : "text_completion");
    chunk["choices"] = json::array();
    chunk["usage"] = usage_object(usage);
    return chunk;
}

json models_response(const std::string& model, int64_t created) {
    return {{"object", "list"},
            {"data", json::array({{{"id", model},
                                   {"object", "model"},
                                   {"created", created},
                                   {"owned_by", "barellm"}}})}};
}

json error_body(const ApiError& error) {
    return {{"error",
             {{"message", error.what()},
              {"type", error.type},
              {"param", error.param.empty() ? json(nullptr) : json(error.param)},
              {"code", error.code.empty() ? json(nullptr) : json(error.code)}}}};
}

std::string sse_event(const json& object) {
    return "data: " + object.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

const char* const kSseDone = "data: [DONE]\n\n";

}  // namespace barellm::serve
