"""Routes: items."""

from fastapi import APIRouter

router = APIRouter()
